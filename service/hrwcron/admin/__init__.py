"""The admin API: a NATS micro service inside every replica, and its client."""

from .api import ADMIN_PREFIX, QUEUE_GROUP, SERVICE_NAME, VERBS
from .client import AdminClient, AdminError, ApiJobs

__all__ = [
    "ADMIN_PREFIX",
    "QUEUE_GROUP",
    "SERVICE_NAME",
    "VERBS",
    "AdminClient",
    "AdminError",
    "ApiJobs",
]
