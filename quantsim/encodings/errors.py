"""The one exception type of the encodings package."""
from __future__ import annotations

__all__ = ["EncodingFormatError"]


class EncodingFormatError(ValueError):
    """An encodings file (or dict, or record list) that cannot be read or written.

    The message always says where: ``"<source>: <entry>: <problem>"``, where ``source`` is the file path
    (or ``"<dict>"`` / a writer label) and ``entry`` names the tensor or list slot concerned.
    """

    def __init__(self, source: str, entry: str | None, problem: str):
        self.source = str(source)
        self.entry = entry
        self.problem = problem
        where = f"{self.source}: {entry}" if entry else self.source
        super().__init__(f"{where}: {problem}")

    def __reduce__(self):
        return (type(self), (self.source, self.entry, self.problem))
