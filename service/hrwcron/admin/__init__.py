"""The admin API: a NATS micro service inside every replica, and its client."""

from hrwcron.admin.api import ADMIN_PREFIX, QUEUE_GROUP, SERVICE_NAME, VERBS
from hrwcron.admin.client import AdminClient, AdminError, ApiJobs

__all__ = [
    "ADMIN_PREFIX",
    "QUEUE_GROUP",
    "SERVICE_NAME",
    "VERBS",
    "AdminClient",
    "AdminError",
    "ApiJobs",
]
