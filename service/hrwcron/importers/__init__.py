"""Schedules that already live somewhere else, read as job specs ``hrwcron apply`` takes.

- :mod:`.crontab`: a Vixie/cronie crontab (a user's, or ``/etc/crontab`` with a user column),
  read the way cronie reads it: variable lines, ``CRON_TZ``, the ``@`` macros, ``%`` in
  commands, no line continuations.
- :mod:`.kubernetes`: CronJob manifests, read the way the CronJob controller does (the standard
  parser of robfig/cron v3, ``spec.timeZone``).
- :mod:`.fields` reads one cron field in each dialect and writes it so that hrwcron reads the
  same values (and the same day rule); :mod:`.common` holds names, bounds and the report.

Everything here is pure: bytes in, a :class:`~.common.Report` out. An import either yields
every spec or, when any entry cannot be expressed, every problem with its file and line and no
spec at all, so nothing is half-written.
"""

from hrwcron.importers.common import MAX_SOURCE_BYTES, Report
from hrwcron.importers.crontab import CrontabOptions, read_crontab
from hrwcron.importers.kubernetes import KubernetesOptions, read_manifests

__all__ = [
    "MAX_SOURCE_BYTES",
    "CrontabOptions",
    "KubernetesOptions",
    "Report",
    "read_crontab",
    "read_manifests",
]
