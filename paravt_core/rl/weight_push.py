"""The policy's weights streamed to a rollout server's snapshot (issue #44 item 8).

Here, not in `paravt_core.dist`: the stream is written by the agent layer's snapshot writer
(`agent.weight_snapshots`), which `dist`, below the agent in the layer contract, may not import.
"""

from __future__ import annotations

from paravt_core.agent.weight_snapshots import TensorSpec
from paravt_core.dist.weights import persistent_buffers


class GatheredWeights:
    """The policy's weights for a rollout server's snapshot, one tensor at a time (issue #44 item 8).

    Only the pushing rank keeps anything: under ZeRO-3 every rank iterates (each parameter's
    gather is a collective all ranks enter, in the same order), and a rank with `keep` False
    yields nothing, so it never holds a gathered copy; the pushing rank gets each parameter
    while it is gathered, on its device, and the snapshot writer copies it to host and into
    the file before the next one is gathered. So no rank holds the whole model on the host,
    where before every rank cloned all of it there (`gathered_state_dict`) and rank 0 copied
    it once more for safetensors' `save_file`.

    The names, shapes and dtypes are the state dict's (ZeRO-3: parameters, each once, then the
    persistent buffers; otherwise the state dict), known without gathering (`ds_shape`);
    the order is the widest dtype first, stable otherwise, so every rank gathers alike.
    """

    def __init__(self, engine, zero_stage: int, keep: bool):
        module = engine.module
        if zero_stage == 3:
            entries = [(name, p, tuple(p.ds_shape), True) for name, p in module.named_parameters()]
            entries += [(name, b, tuple(b.shape), False) for name, b in persistent_buffers(module)]
        else:
            entries = [(name, t, tuple(t.shape), False) for name, t in module.state_dict().items()]
        self._entries = sorted(entries, key=lambda entry: -entry[1].dtype.itemsize)
        self.specs = [TensorSpec(name, shape, tensor.dtype) for name, tensor, shape, _ in self._entries]
        self.keep = keep

    def __iter__(self):
        import torch

        with torch.no_grad():
            for name, tensor, _, partitioned in self._entries:
                if not partitioned:
                    if self.keep:
                        yield name, tensor.detach()
                    continue
                import deepspeed

                with deepspeed.zero.GatheredParameters([tensor]):
                    if self.keep:
                        yield name, tensor.detach()
