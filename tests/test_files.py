"""Output files are replaced whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart.files import write_text_atomic


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_text_atomic(path, "old\n")
    write_text_atomic(path, "new\n")
    assert path.read_text() == "new\n" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.json"
    path.write_text("finished steps\n")
    real = Path.write_text

    def torn(self: Path, text: str, *args, **kwargs) -> int:  # noqa: ANN002, ANN003
        real(self, text[: len(text) // 2])
        raise KeyboardInterrupt  # a third Ctrl-C mid-write

    monkeypatch.setattr(Path, "write_text", torn)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(path, '{"steps": [1, 2, 3]}\n')
    monkeypatch.undo()
    assert path.read_text() == "finished steps\n" and [p.name for p in tmp_path.iterdir()] == ["r.json"]
