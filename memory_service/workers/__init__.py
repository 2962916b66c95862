"""The background workers: the arq worker (``worker``), its jobs and its cron schedules.

A job is thin: it calls MemoryService, which does the work; what is enqueued and under which
id lives with the code that enqueues it (memory_service.formation.jobs).
"""
