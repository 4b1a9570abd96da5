"""Reading the recorded API traffic of tests/recordings (recorded from a real API server)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eventop.watcher.recording import load_initial, load_recording, read_watch_file

REC = Path(__file__).resolve().parents[1] / "recordings"


def _rv(obj: dict) -> int:
    return int(obj["metadata"]["resourceVersion"])


def test_directories_merge_into_one_timeline_by_resource_version() -> None:
    events = load_recording(REC / "copy-rules")
    rvs = [_rv(o) for _, o in events]
    assert rvs == sorted(rvs)
    assert len(events) == 23  # 10 + 7 + 2 + 4 changes, bookmarks left out
    assert {c for c, _ in events} == {"add", "update", "delete"}
    assert events[0][0] == "add" and events[0][1]["metadata"]["name"] == "team-a"
    assert events[-1][0] == "delete" and events[-1][1]["kind"] == "CopyRule"


def test_files_and_directories_can_be_mixed() -> None:
    events = load_recording([REC / "mirrors-and-rates",
                             REC / "copy-rules" / "api_v1_secrets.watch.jsonl"])
    assert [o["kind"] for _, o in events][:2] == ["Secret", "Secret"]
    assert len(events) == 2 + 4 + 6


def test_error_event_is_not_a_change_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert load_recording(REC / "watch-expired") == []
    assert "410 Expired" in caplog.text


def test_truncated_line_is_skipped_with_a_warning(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    src = (REC / "copy-rules" / "api_v1_secrets.watch.jsonl").read_text().splitlines()
    (tmp_path / "x.watch.jsonl").write_text(src[0] + "\n" + src[1][:50] + "\n")
    with caplog.at_level(logging.WARNING):
        events = load_recording(tmp_path)
    assert [c for c, _ in events] == ["add"]
    assert "undecodable line" in caplog.text


def test_raw_reader_keeps_error_and_bookmark_lines() -> None:
    types = [t for t, _ in read_watch_file(REC / "copy-rules" / "api_v1_secrets.watch.jsonl")]
    assert types == ["ADDED", "MODIFIED", "BOOKMARK", "BOOKMARK", "BOOKMARK"]


def test_list_items_get_kind_and_api_version_from_the_list() -> None:
    items = load_initial(REC / "copy-rules")
    assert items and all(i["apiVersion"] == "v1" for i in items)
    assert {i["kind"] for i in items} == {"ConfigMap", "Namespace"}


def test_missing_path_is_reported() -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_recording(REC / "nope")
