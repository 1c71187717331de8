"""Checkpoints: what is written to disk and read back, in layers.

- :mod:`.files`: single files: values made safe to load, atomic writes, loading that never
  runs code from the file (``weights_only=True``). Knows nothing of the Trainer.
- :mod:`.state_dirs`: training-state directories: their layout, manifest, atomic
  publication, discovery of the newest complete one, and RNG capture. Knows nothing of the
  Trainer.
- :mod:`.finite`: the check, at save time, that no NaN or infinite weights are written.
- :mod:`.state_checks`: every file of a state read and checked against the objects it is
  meant for, before anything is loaded (all-or-nothing loads). Knows nothing of the Trainer.
- :mod:`.original_states`: training-state directories written by pytorch-accelerated 0.1.x
  (accelerate's ``save_state`` layout plus ``trainer_metadata.pt``), read safely; never written.
- :mod:`.trainer_io`: the Trainer's ``save_checkpoint`` / ``load_checkpoint`` /
  ``save_training_state`` / ``load_training_state``, built on the modules above through the
  Trainer's public attributes only.
"""
