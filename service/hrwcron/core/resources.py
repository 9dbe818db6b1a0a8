"""The default names of what hrwcron keeps in NATS, and the shapes replicas and workers must
agree on, defined once: the configuration, the provisioning, the engine, the worker SDK and
the telemetry read them from here. A deployment
may rename each in its configuration (``[scheduler]``); the worker SDK takes the same names
as arguments."""

from __future__ import annotations

MEMBERS_BUCKET = "hrwcron_members"  # heartbeats, one key per replica, with a TTL
CLAIMS_BUCKET = "hrwcron_claims"  # create-only claims, one key per tick
JOBS_BUCKET = "hrwcron_jobs"  # job specs (keys by lane, core/partitions.py)
RUNS_BUCKET = "hrwcron_runs"  # run markers of jobs with overlap = "skip"
COUNTS_BUCKET = "hrwcron_counts"  # run counts of jobs with max_runs
PROCESSED_BUCKET = "hrwcron_processed"  # the worker SDK's record of each tick it ran
TRIGGER_STREAM = "HRWCRON_TRIGGERS"
SUBJECT_PREFIX = "hrwcron.trigger"  # every trigger subject is below it
# Replicas' progress marks go to <this>.<members bucket> (core NATS, scheduler role only).
MARKS_SUBJECT_PREFIX = "hrwcron.progress"
# The runs bucket's TTL: a run marker outlives a worker that died holding it by this much.
RUN_MARKER_TTL = 30.0
