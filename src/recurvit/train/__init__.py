"""Training machinery every task shares: the one loop (fit.py), losses (deep supervision, depth
schedules), optimizer + schedule, resume (what a resume may change), the one-line refusals (checks)
and TensorBoard. Run directories, checkpoints, device, loaders and processes are the floor below,
:mod:`recurvit.run`; the tasks the loop trains are :mod:`recurvit.tasks`."""
