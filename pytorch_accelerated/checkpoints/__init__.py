"""Checkpoints: what is written to disk and read back. None of these modules knows the Trainer:
each is given the objects it works on (most take a :class:`.training_objects.TrainingObjects`).

Training states (directories that hold everything needed to resume a run):

- :mod:`.store`: :class:`~.store.TrainingStateStore`, the Trainer's part that saves a state (now,
  or in the background), waits for it, loads one and resumes a run from one, every process agreeing
  after each step.
- :mod:`.layouts`: one class per kind of state directory (plain, sharded under FSDP, the 0.1.x
  library's), chosen once per save or load: its files, how they are written, checked and loaded.
- :mod:`.training_objects`: :class:`~.training_objects.TrainingObjects`, the parts of a run that a
  state saves and restores, handed over by the Trainer.
- :mod:`.directories`: a state directory on disk: its files, the manifest, atomic publication.
- :mod:`.discovery`: finding the state a path names, or the newest complete one in a folder.
- :mod:`.auto_resume`: what ``resume_from="auto"`` decides, the same on every process: the state
  to resume from in the run's folder, or a new run.
- :mod:`.folder_lock`: one run per folder: the lock a run that writes states holds on their folder.
- :mod:`.background`: a state written in a background thread, from a copy in host memory.
- :mod:`.rng`: every random number generator of a process, captured and restored.
- :mod:`.trainable`: which parameters require gradients, recorded and restored (fine-tuning).
- :mod:`.resume`: the position a state records, the run's settings checked against the saved
  ones, and the position restored; :mod:`.reshard`: the position mapped onto other settings.
- :mod:`.settings_checks`: the run's settings a state records (training-set length, seed,
  optimizer), compared on resume: refused or announced; the line a resume prints.
- :mod:`.sharded`: sharded models (FSDP): their whole states, and their shards in training states.
- :mod:`.original_states`: reading training states written by pytorch-accelerated 0.1.x.

Both kinds of checkpoint:

- :mod:`.files`: single files: values made safe to load, atomic writes, loading that never runs
  code from the file (``weights_only=True``).
- :mod:`.model_files`: single-file checkpoints (``save_checkpoint`` / ``load_checkpoint``).
- :mod:`.finite`: the check, at save time, that no NaN or infinite weights are written.
- :mod:`.state_checks`: every file read and checked against its object before anything is loaded.
- :mod:`.collective_saves`: which process writes what, and every process agreeing on the outcome.
"""
