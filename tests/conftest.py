"""Test-wide settings: the preparation cache lives in a per-session temp dir, never in the user's home."""
import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_prepare_cache(tmp_path_factory):
    patcher = pytest.MonkeyPatch()
    patcher.setenv("QUANTSIM_CACHE_DIR", str(tmp_path_factory.mktemp("quantsim-cache")))
    yield
    patcher.undo()
