"""The arq worker (formation jobs, cold-session sweeps, retention) lands here.

Until then formation runs in-process, behind memory_service.formation.form_window,
the one function the worker will call.
"""
