"""Small helpers of the Trainer that are not public API (names and behaviour may change).

- :mod:`.validation`: argument checks, each message naming the value seen and the fix;
- :mod:`.distributed`: gathering tensors of different lengths, means and flags over processes,
  printing once per node (what the Trainer's process methods do);
- :mod:`.accumulation`: how the batches of an accumulation window are weighted;
- :mod:`.process_group`: the collective timeout of the process group, a seed every process
  agrees on, and the group's destruction at exit;
- :mod:`.preparation`: the Trainer's record of what accelerate has prepared (``Preparation``),
  preparing model, optimizer and loaders, and where the loop steps around accelerate's wrappers;
- :mod:`.fsdp`: whether a run, a module or a tensor is sharded, and refusing what cannot run
  under FSDP;
- :mod:`.accelerator_checks`: the Accelerator's set-up checked when a Trainer is created
  (processes, accumulation, a precision or FSDP that cannot run here).
"""
