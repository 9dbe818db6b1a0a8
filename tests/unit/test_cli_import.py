"""``hrwcron import`` without a cluster: what it prints is what ``apply`` reads, and a file with
problems prints nothing but the problems (exit 2)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from hrwcron.cli import main
from hrwcron.cli.apply import _jobs_from_file

CORPUS = Path(__file__).resolve().parents[1] / "vectors" / "imports"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_crontab_prints_the_specs_apply_reads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    source = CORPUS / "system.crontab"
    code, out, err = run(capsys, "import", "crontab", str(source), "--system", "--prefix", "h1")
    assert (code, err) == (0, "")
    printed = tmp_path / "jobs.json"
    printed.write_text(out)
    specs = _jobs_from_file(str(printed))
    assert len(specs) == len(json.loads(out)) == 10
    assert all(spec.name.startswith("h1.") and spec.problems() == [] for spec in specs)
    assert specs[0].payload["user"] == "root"


def test_cronjobs_from_several_files_print_with_notes_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = [str(CORPUS / name) for name in ("cronjobs.yaml", "helm-rendered.yaml")]
    code, out, err = run(capsys, "import", "kubernetes", *files, "--labels-as-tags")
    assert code == 0
    names = [spec["name"] for spec in json.loads(out)]
    assert "prod.db-backup" in names and "default.release-nightly-jobs-quarter" in names
    assert err.splitlines() == [
        f"hrwcron import: note: {files[0]}:58: skipped Service web (not a CronJob)",
        f"hrwcron import: note: {files[0]}:123: CronJob billing/invoices: "
        "startingDeadlineSeconds 3600: replicas take a max_lateness up to their "
        "scheduler.duplicate_window (600 s unless set)",
        f"hrwcron import: note: {files[1]}:27: skipped ConfigMap release-nightly-jobs "
        "(not a CronJob)",
    ]


def test_problems_are_reported_with_their_lines_and_nothing_is_printed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    tab = tmp_path / "crontab"
    tab.write_text("0 1 * * * fine\n@reboot /opt/agent\n0 0 L * * last\n")
    code, out, err = run(capsys, "import", "crontab", str(tab))
    assert (code, out) == (2, "")
    assert [line.split(": ", 3)[2] for line in err.splitlines()] == [f"{tab}:2", f"{tab}:3"]
    assert err.startswith(f"hrwcron import: error: {tab}:2: @reboot")


def test_standard_input_is_read_for_a_dash(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin = io.TextIOWrapper(io.BytesIO(b"*/10 * * * * /usr/bin/check\n"))
    monkeypatch.setattr("sys.stdin", stdin)
    code, out, _ = run(capsys, "import", "crontab", "-", "--user", "alice")
    assert code == 0
    [spec] = json.loads(out)
    assert spec["payload"] == {"command": "/usr/bin/check", "user": "alice"}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["import", "crontab", "/nonexistent/crontab"], "/nonexistent/crontab: cannot read"),
        (["import", "crontab", "FILE", "--dry-run"], "--dry-run: goes with --apply"),
        (["import", "kubernetes", "FILE", "--atomic"], "--atomic: goes with --apply"),
        (["import", "crontab", "FILE", "--tz", "Mars/Olympus"], "--tz: 'Mars/Olympus' is not"),
        (["import", "crontab", "FILE", "--prefix", "a b"], "--prefix: 'a b' has the bad token"),
        (["import", "crontab", "FILE", "--system", "--user", "x"], "not allowed with argument"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_read(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert needle in err, err


def test_help_says_how_the_crontab_form_is_chosen(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "import", "crontab", "--help")
    text = " ".join(out.split())
    assert code == 0
    assert "--system reads /etc/crontab's form" in text and "it is not guessed" in text
    assert "cronie has no line continuations" in text
