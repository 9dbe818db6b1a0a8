"""The CronJob importer: what the controller reads, every refusal with its file and line, and
the bounds that keep hostile YAML cheap."""

from __future__ import annotations

import textwrap

import pytest

import hrwcron.importers.kubernetes as kubernetes
from hrwcron.core.errors import ImportSourceError
from hrwcron.importers import KubernetesOptions, Report, read_manifests
from hrwcron.importers.common import MAX_SOURCE_BYTES
from hrwcron.importers.kubernetes import cronjob_schedule


def cronjob(name: str = "job", *, namespace: str | None = "ns", **spec: object) -> str:
    fields = {"schedule": "'0 * * * *'", "jobTemplate": "{spec: {}}"}
    fields.update({k: str(v) for k, v in spec.items()})
    ns = f"\n  namespace: {namespace}" if namespace else ""
    body = "\n".join(f"  {k}: {v}" for k, v in fields.items())
    return f"apiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: {name}{ns}\nspec:\n{body}\n"


def read(*texts: str | bytes, **options: object) -> Report:
    files = [(f"f{i}.yaml", t.encode() if isinstance(t, str) else t) for i, t in enumerate(texts)]
    return read_manifests(files, KubernetesOptions(**options))  # type: ignore[arg-type]


def problems(*texts: str | bytes, **options: object) -> list[str]:
    report = read(*texts, **options)
    with pytest.raises(ImportSourceError) as caught:
        report.specs_or_raise()
    return [str(p) for p in caught.value.problems]


# --- refusals, each at the line of its field ---------------------------------------------------


def test_replace_is_refused_at_its_line() -> None:
    [problem] = problems(cronjob(concurrencyPolicy="Replace"))
    assert problem.startswith("f0.yaml:9: CronJob ns/job: concurrencyPolicy Replace")
    assert "not supported" in problem


def test_every_problem_of_a_cronjob_is_reported_each_at_its_line() -> None:
    found = problems(
        cronjob(
            schedule="'CRON_TZ=UTC 0 * * * *'",
            concurrencyPolicy="Replace",
            startingDeadlineSeconds="0",
            timeZone="Local",
            suspend="'yes'",
        )
    )
    assert [p.split(": ")[0] for p in found] == [f"f0.yaml:{n}" for n in (7, 9, 10, 11, 12)]
    assert "Kubernetes refuses TZ or CRON_TZ in spec.schedule" in found[0]
    assert "spec.timeZone: must not be 'Local'" in found[3]
    assert "startingDeadlineSeconds 0:" in found[2] and "suspend 'yes'" in found[4]


@pytest.mark.parametrize(
    ("schedule", "needle"),
    [
        ("TZ=Europe/Berlin 0 9 * * *", "Kubernetes refuses TZ or CRON_TZ"),
        ("@every 5m", "@every counts from when the controller first saw the CronJob"),
        ("@Daily", "unrecognized descriptor '@Daily'"),
        (" @daily", "expected exactly 5 fields, found 1"),
        ("0 0 9 * * *", "expected exactly 5 fields, found 6"),
        ("0 0 * * 7", "day-of-week: '7' is out of range 0-6"),
        ("0 0 * * FRI-SUN", "the range in 'FRI-SUN' runs backwards (5 > 0)"),
        ("0 0 L * *", "day-of-month: 'L' is not a number (robfig/cron has none of the L, W"),
        ("0 0 * * 1#2", "'1#2' is not a number or a name"),
        ("0 0-5-7 * * *", "too many hyphens in '0-5-7'"),
        ("*/0 * * * *", "the step in '*/0' must be 1 or more"),
        ("60 * * * *", "'60' is out of range 0-59"),
        ("0 0 31 2 *", "no day in '31' exists in the month(s) '2'"),
        (",, * * * *", "',,' has no value, so the schedule never fires"),
        ("", "empty"),
    ],
)
def test_a_schedule_the_controller_refuses_is_refused_with_the_reason(
    schedule: str, needle: str
) -> None:
    [problem] = problems(cronjob(schedule=repr(schedule)))
    assert problem.startswith("f0.yaml:7: CronJob ns/job: ") and needle in problem, problem


def test_a_bad_time_zone_or_deadline_is_refused() -> None:
    [zone] = problems(cronjob(timeZone="Mars/Olympus"))
    assert zone.startswith("f0.yaml:9: CronJob ns/job: spec.timeZone: 'Mars/Olympus' is not")
    for deadline in ("100000", "-1", "'10'", "true"):
        [late] = problems(cronjob(startingDeadlineSeconds=deadline))
        assert late.startswith("f0.yaml:9: CronJob ns/job: startingDeadlineSeconds "), late


def test_a_cronjob_without_a_name_spec_or_known_api_version_is_refused() -> None:
    found = problems(
        "apiVersion: batch/v2\nkind: CronJob\nmetadata: {}\n",
    )
    assert found == [
        "f0.yaml:1: CronJob: apiVersion 'batch/v2': CronJobs are read as batch/v1",
        "f0.yaml:1: CronJob: spec is missing or not a mapping",
        "f0.yaml:3: CronJob: metadata.name is missing or not a string",
    ]


def test_the_same_cronjob_in_two_files_is_refused() -> None:
    [problem] = problems(cronjob(), "# again\n" + cronjob())
    assert (
        problem == "f1.yaml:2: CronJob ns/job: the job name 'ns.job' is already taken at f0.yaml:1"
    )


def test_a_label_that_cannot_be_a_tag_is_refused_only_when_labels_are_tags() -> None:
    text = cronjob().replace("  namespace: ns\n", "  namespace: ns\n  labels: {note: two words}\n")
    assert read(text).problems == []
    [problem] = problems(text, labels_as_tags=True)
    assert problem.startswith("f0.yaml:6: CronJob ns/job: label note=two words: a tag is 1-64")


def test_yaml_that_does_not_parse_is_refused_at_its_line() -> None:
    [problem] = problems(cronjob() + "---\nkind: CronJob\nmetadata: [unclosed\n")
    assert problem.startswith("f0.yaml:12: is not valid YAML")


def test_every_file_is_read_and_a_bad_one_does_not_hide_the_others_problems() -> None:
    found = problems("a: [", cronjob(concurrencyPolicy="Replace"))
    assert [p.split(":")[0] for p in found] == ["f0.yaml", "f1.yaml"]


# --- bounds -------------------------------------------------------------------------------------


def test_an_alias_bomb_is_refused_before_it_is_expanded() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        refs = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    bomb = cronjob().replace("jobTemplate: {spec: {}}", "jobTemplate: {spec: {}}") + "\n".join(
        ["---", *lines]
    )
    [problem] = problems(bomb)
    assert "its aliases expand this document past 1000000 nodes" in problem


def test_an_alias_that_refers_to_itself_is_refused() -> None:
    [problem] = problems("a: &loop [1, *loop]\n")
    assert problem == "f0.yaml:1: a YAML alias refers to itself"


def test_aliases_that_stay_small_are_read() -> None:
    text = textwrap.dedent(
        """\
        apiVersion: batch/v1
        kind: CronJob
        metadata: {name: job, namespace: ns}
        spec:
          schedule: '0 * * * *'
          jobTemplate:
            spec:
              template:
                spec:
                  containers:
                    - {name: a, env: &env [{name: X, value: '1'}]}
                    - {name: b, env: *env}
        """
    )
    [spec] = read(text).specs
    containers = spec.payload["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert containers[0]["env"] == containers[1]["env"] == [{"name": "X", "value": "1"}]


def test_deep_nesting_is_refused_with_a_clear_error() -> None:
    [problem] = problems("[" * 5000 + "]" * 5000)
    assert problem == "f0.yaml: nests YAML too deeply to read"


def test_a_file_larger_than_the_bound_is_refused() -> None:
    [problem] = problems(b"#" * (MAX_SOURCE_BYTES + 1))
    assert problem == f"f0.yaml: is more than {MAX_SOURCE_BYTES} bytes, the most one file may be"


def test_more_objects_than_the_bound_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubernetes, "MAX_OBJECTS", 3)
    many = "---\n".join(cronjob(f"j{i}") for i in range(3))
    assert len(read(many).specs) == 3
    found = problems(many, "---\n" + cronjob("one-more"))
    assert found == ["f1.yaml:2: more than 3 objects in all; import fewer at once"]


# --- what the controller reads -----------------------------------------------------------------


def test_lists_multi_documents_and_other_objects() -> None:
    text = (
        "apiVersion: v1\nkind: List\nitems:\n"
        + textwrap.indent(cronjob("a"), "  ").replace("  apiVersion", "- apiVersion", 1)
        + "---\napiVersion: v1\nkind: Secret\nmetadata: {name: s}\n---\n---\n- just a list\n"
    )
    report = read(text, cronjob("b", namespace=None))
    assert [s.name for s in report.specs] == ["ns.a", "default.b"]
    assert [str(n) for n in report.notes] == [
        "f0.yaml:13: skipped Secret s (not a CronJob)",
        "f0.yaml:18: skipped: not a Kubernetes object (no mapping)",
    ]


def test_the_fields_of_a_cronjob_map_to_the_job() -> None:
    [spec] = read(
        cronjob(
            timeZone="Europe/Berlin",
            suspend="true",
            concurrencyPolicy="Forbid",
            startingDeadlineSeconds="300",
        ).replace(
            "  namespace: ns\n", "  namespace: ns\n  labels: {app.kubernetes.io/name: web}\n"
        ),
        labels_as_tags=True,
        prefix="k8s",
    ).specs
    assert (spec.name, spec.tz, spec.paused, spec.overlap) == (
        "k8s.ns.job",
        "Europe/Berlin",
        True,
        "skip",
    )
    assert (spec.max_lateness, spec.catchup, spec.tags) == (
        300.0,
        "latest",
        ["app.kubernetes.io:name=web"],
    )
    assert spec.payload == {"namespace": "ns", "cronjob": "job", "jobTemplate": {"spec": {}}}


def test_a_deadline_beyond_the_default_duplicate_window_is_imported_with_a_note() -> None:
    report = read(cronjob(startingDeadlineSeconds="3600"))
    [spec] = report.specs
    assert spec.max_lateness == 3600.0
    [note] = report.notes
    assert (
        note.where == "f0.yaml:9"
        and "scheduler.duplicate_window (600 s unless set)" in note.message
    )
    assert read(cronjob(startingDeadlineSeconds="600")).notes == []


def test_a_cronjob_without_a_zone_is_in_the_controllers() -> None:
    [spec] = read(cronjob(), tz="America/Chicago").specs
    assert spec.tz == "America/Chicago" and spec.max_lateness == 60.0 and spec.overlap == "allow"


def test_a_job_template_with_keys_json_cannot_hold_is_refused_at_its_line() -> None:
    [problem] = problems(cronjob(jobTemplate="{null: x, true: y}"))
    assert problem.startswith("f0.yaml:8: CronJob ns/job: spec.jobTemplate is not JSON: ")


def test_yaml_values_become_the_json_they_stand_for() -> None:
    [spec] = read(cronjob(jobTemplate="{when: 2026-01-01, raw: !!binary aGk=, n: 1.5}")).specs
    assert spec.payload["jobTemplate"] == {"when": "2026-01-01", "raw": "aGk=", "n": 1.5}


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        ("*/5 * * * *", "*/5 * * * *"),
        ("0 9 * * MON-FRI", "0 9 * * MON-FRI"),
        ("0 */6 ? * *", "0 */6 * * *"),  # '?' is '*' in every field
        ("? * * * *", "* * * * *"),
        ("0 0 */2 * *", "0 0 */2 * *"),  # the other day field is '*': no rule to keep
        ("0 0 */2 * 1", "0 0 1-31/2 * 1"),  # restricted for robfig: the OR rule
        ("0 0 1 * */2", "0 0 1 * 0-6/2"),
        ("0 0 *,5 * 1", "0 0 * * 1"),  # '*' anywhere in a list is the whole field
        ("5/15 * * * *", "5/15 * * * *"),
        ("+5 * * * *", "5 * * * *"),
        ("0 0 * * sun-sun", "0 0 * * 0-0"),
        ("@weekly", "@weekly"),
    ],
)
def test_a_schedule_reads_as_the_controller_reads_it(schedule: str, expected: str) -> None:
    assert cronjob_schedule(schedule) == expected


@pytest.mark.parametrize("policy", ["[1, 2]", "{a: b}", "5", "forbid"])
def test_a_concurrency_policy_of_another_shape_is_refused(policy: str) -> None:
    [problem] = problems(cronjob(concurrencyPolicy=policy))
    assert problem.startswith("f0.yaml:9: CronJob ns/job: concurrencyPolicy ")
    assert "is not Allow, Forbid or Replace" in problem
