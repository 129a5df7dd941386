"""Test-wide settings: the preparation cache lives in a per-session temp dir, never in the user's home."""
import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_prepare_cache(tmp_path_factory):
    patcher = pytest.MonkeyPatch()
    patcher.setenv("QUANTSIM_CACHE_DIR", str(tmp_path_factory.mktemp("quantsim-cache")))
    yield
    patcher.undo()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "int8_kernels: compares with onnxruntime's uint8 x int8 integer kernels, which saturate on "
        "x86 CPUs with AVX2 but no VNNI (quantsim.graph.int8_kernels); skipped there")


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("int8_kernels")]
    if not marked:
        return
    from quantsim.graph.int8_kernels import SATURATION_NOTE, uint8_int8_kernels_saturate

    if uint8_int8_kernels_saturate():
        skip = pytest.mark.skip(reason=SATURATION_NOTE)
        for item in marked:
            item.add_marker(skip)
