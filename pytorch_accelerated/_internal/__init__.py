"""Small helpers of the Trainer that are not public API (names and behaviour may change).

- :mod:`.argument_checks`: argument checks, each message naming the value seen and the fix;
- :mod:`.batch_loss`: what the default ``calculate_*_batch_loss`` does with a batch: inputs and
  targets, the number of samples, the loss (with an error that says how to fix other shapes);
- :mod:`.distributed`: gathering tensors of different lengths, means and flags over processes,
  printing once per node (what the Trainer's process methods do);
- :mod:`.accumulation`: how the batches of an accumulation window are weighted;
- :mod:`.intervals`: ``every(n, count)``, the one rule for "every N updates";
- :mod:`.process_group`: the collective timeout of the process group, a seed every process
  agrees on, and the group's destruction at exit (waiting for gloo's threads to be idle);
- :mod:`.preparation`: the Trainer's record of what accelerate has prepared (``Preparation``),
  preparing model, optimizer and loaders, and where the loop steps around accelerate's wrappers;
- :mod:`.fsdp`: whether a run, a module or a tensor is sharded, and refusing what cannot run
  under FSDP;
- :mod:`.accelerator_checks`: the Accelerator's set-up checked when a Trainer is created
  (processes, accumulation, a precision or FSDP that cannot run here);
- :mod:`.launch_checks`: a launch whose processes do not add up fails early (the rendezvous
  timeout);
- :mod:`.agent_store`: under torchrun, the process group formed on the agent's store in a
  namespace of its own per attempt, so that a restarted group forms;
- :mod:`.hangs`: what a failed collective operation was doing, and the watchdog that ends a
  process a stop signal finds stuck;
- :mod:`.errors`: ``StopTrainingError`` (public through :mod:`pytorch_accelerated.callbacks`), and
  which exceptions end a run on purpose.
"""
