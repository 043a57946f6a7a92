"""Runtime: where a run lives and how it runs, below everything that computes.

* ``runs`` — run records (package versions, identity), atomic writes, staged and resumable run
  directories (:class:`~inductionlab.runtime.runs.ResumableRun`).
* ``outputs`` — output paths checked before anything heavy is loaded.
* ``distributed`` — torchrun process groups, sharding and gathering (:class:`~inductionlab.runtime.distributed.Dist`).
* ``dtype_choice`` — ``dtype="auto"``: bf16 where the device runs it fast.
* ``model_specs`` — a model spec resolved to where the model lies (torch-free).
* ``model_size`` — a model's weights estimated from its config, refused above the memory available.
* ``run_dir`` — :class:`~inductionlab.runtime.run_dir.TrainRun`, the one reader of a training-run directory
  (torch-free; :mod:`inductionlab.train.checkpoint` is its writer).

Imports only the package's face (``errors``, ``names``, ``checks``). Add here what every layer above
may need about files, processes or devices, and nothing that knows a model, a corpus or a protocol.
"""
