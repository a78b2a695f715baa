"""The floor every consumer of a run stands on (training, evaluation, analysis, studies, export): nothing
here knows a task, and nothing here imports train/, tasks/, analysis/, study/ or export/.

- atomic: every write is whole or absent (temp file, fsync, rename); a full disk is one line;
- outputs: files a command writes where the user says, never over a file recurvit did not write;
- lock: the one ``flock`` of a folder one process writes (a run directory, a study folder);
- rundir: ``RunDir``, the one owner of a run directory (create, lock, config, metrics, resume);
- checkpoint: the checkpoint schema and its safe load; preprocessing: the input record a checkpoint carries;
- device, progress, loaders, distributed: where a run computes, what it shows, what it reads, its processes.

Modules are imported by name (``from recurvit.run.rundir import RunDir``): this file imports nothing, so
reading the progress helpers does not import torch."""
