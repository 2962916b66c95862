from memory_service._vendor.arq.connections import ArqRedis, create_pool
from memory_service._vendor.arq.cron import cron
from memory_service._vendor.arq.version import VERSION
from memory_service._vendor.arq.worker import Retry, Worker, check_health, func, run_worker

__version__ = VERSION

__all__ = (
    'ArqRedis',
    'create_pool',
    'cron',
    'VERSION',
    'Retry',
    'Worker',
    'check_health',
    'func',
    'run_worker',
)
