"""Analysis: accounting (params, FLOPs, memory), matched partners, horizon sweeps, reports.

Import the submodules directly, e.g. ``from recurvit.analysis.accounting import account``.
"""
