"""Small helpers of the Trainer that are not public API (names and behaviour may change).

- :mod:`.validation`: argument checks, each message naming the value seen and the fix;
- :mod:`.distributed`: gathering tensors of different lengths, means over processes, and the
  Trainer's process methods (``ProcessUtilities``);
- :mod:`.accumulation`: how the batches of an accumulation window are weighted;
- :mod:`.accelerate_support`: what accelerate's set-up allows the loop to do.
"""
