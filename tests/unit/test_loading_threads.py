"""Threads of one process load models and processors one at a time (`model.loading._LOADING`).

The reproduction's fan-out runs jobs on threads of one process, and two of them can load at the
same moment. transformers 5 imports its classes on first use; two first loads at once can see a
module the other thread is still importing ("cannot import name 'AutoProcessor' from
'transformers'", seen in a reproduction's sampled probes). Holding the loads apart closes that.
"""

from __future__ import annotations

import threading
import time

import transformers

from paravt_core.model.loading import load_model, load_processor


class _Overlap:
    """Counts how many wrapped calls run at once."""

    def __init__(self) -> None:
        self.guard, self.inside, self.most = threading.Lock(), 0, 0

    def wrap(self, real):
        def slow(*args, **kwargs):
            with self.guard:
                self.inside += 1
                self.most = max(self.most, self.inside)
            try:
                time.sleep(0.2)  # long enough for the other threads to arrive while this load runs
                return real(*args, **kwargs)
            finally:
                with self.guard:
                    self.inside -= 1
        return slow


def test_threads_loading_at_once_take_turns(tiny_model_dir, monkeypatch):
    overlap = _Overlap()
    for cls in (transformers.AutoProcessor, transformers.AutoModelForImageTextToText):
        monkeypatch.setattr(cls, "from_pretrained", overlap.wrap(cls.from_pretrained))
    start = threading.Barrier(4)
    loaded, failed = [], []

    def load(fn) -> None:
        start.wait()
        try:
            loaded.append(fn(tiny_model_dir))
        except Exception as error:  # the test reports every thread's failure, not only the first
            failed.append(error)

    threads = [threading.Thread(target=load, args=(fn,)) for fn in (load_processor, load_model) * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failed and len(loaded) == 4
    assert overlap.most == 1, f"{overlap.most} loads ran at once"
