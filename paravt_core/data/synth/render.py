"""Drawing `VideoSpec`s into frames and mp4 bytes (H.264 or MPEG-4 Part 2, yuv420p).

Frame i shows the scene at i / fps seconds. The same spec always gives the same bytes
(the mirror's commit hash depends on them), which takes three precautions: encoding is
single-threaded; frames reach the encoder as yuv420p planes that this module fills
completely, alignment padding included (swscale leaves it uninitialised); and x264's
macroblock-tree rate control is off (`mbtree=0`): with it, the SIMD build gave different
bytes from run to run for some 96-pixel-wide videos.
"""

from __future__ import annotations

import io
import math

import numpy as np

from paravt_core.data.synth.glyphs import FONT_ROWS, digit_mask, shape_mask
from paravt_core.data.synth.world import COLOURS, TINTS, Event, VideoSpec

WAVE_AMPLITUDE = 7.0  # grey levels; the background drifts but stays low-saturation
GRADIENT_SPAN = 50.0  # grey levels from the dark side to the bright side


def object_size(spec: VideoSpec) -> int:
    """Side of the box a shape is drawn in: 40% of the short side."""
    return round(0.4 * min(spec.width, spec.height))


def edge_margin(spec: VideoSpec) -> int:
    return max(2, round(0.06 * min(spec.width, spec.height)))


def digit_scale(spec: VideoSpec) -> int:
    """Font pixels per bitmap cell: the digit is about 55% of the frame height."""
    return max(2, int(0.55 * spec.height) // FONT_ROWS)


def anchor(spec: VideoSpec, position: str, box_w: int, box_h: int) -> tuple[int, int]:
    """Top-left (x, y) of a box_w x box_h box placed at a named position."""
    m = edge_margin(spec)
    right, bottom = spec.width - box_w - m, spec.height - box_h - m
    corners = {
        "top left": (m, m),
        "top right": (right, m),
        "bottom left": (m, bottom),
        "bottom right": (right, bottom),
        "centre": ((spec.width - box_w) // 2, (spec.height - box_h) // 2),
    }
    return corners[position]


class FrameRenderer:
    """Renders frame i of one video; the static parts are computed once."""

    def __init__(self, spec: VideoSpec) -> None:
        self.spec = spec
        ys, xs = np.mgrid[0 : spec.height, 0 : spec.width].astype(np.float32)
        self._u, self._v = xs / spec.width, ys / spec.height
        toward_bright = {"top": 1 - self._v, "bottom": self._v, "left": 1 - self._u, "right": self._u}
        grey = spec.background.level + GRADIENT_SPAN * (toward_bright[spec.background.bright_side] - 0.5)
        self._static = grey[..., None] + np.array(TINTS[spec.background.tint], dtype=np.float32)  # [H, W, 3]
        self._size = object_size(spec)

    def frame(self, index: int) -> np.ndarray:
        """RGB uint8 [H, W, 3] of frame `index`."""
        t = index / self.spec.fps
        drift = np.zeros_like(self._u)
        for cycles_x, cycles_y, period, phase in self.spec.background.waves:
            drift += np.sin(2 * math.pi * (cycles_x * self._u + cycles_y * self._v + t / period) + phase)
        image = np.clip(self._static + WAVE_AMPLITUDE * drift[..., None], 0, 255).astype(np.uint8)
        for event in self.spec.events:
            if event.start_frame <= index < event.end_frame:
                self._draw(image, event, index)
        return image

    def _draw(self, image: np.ndarray, event: Event, index: int) -> None:
        if event.kind == "digit":
            mask = digit_mask(event.digit, digit_scale(self.spec))
            x, y = anchor(self.spec, event.position, mask.shape[1], mask.shape[0])
        elif event.kind == "shape":
            mask = shape_mask(event.shape, self._size)
            x, y = anchor(self.spec, event.position, self._size, self._size)
        else:
            mask = shape_mask(event.shape, self._size)
            x, y = self._motion_position(event, index)
        region = image[y : y + mask.shape[0], x : x + mask.shape[1]]
        region[mask] = COLOURS[event.colour]

    def _motion_position(self, event: Event, index: int) -> tuple[int, int]:
        """Linear sweep from one side to the other over the event's frames, fully in view."""
        m = edge_margin(self.spec)
        span = self.spec.width - self._size - 2 * m
        frames = event.end_frame - event.start_frame
        progress = (index - event.start_frame) / (frames - 1) if frames > 1 else 0.5
        if event.direction == "right to left":
            progress = 1.0 - progress
        return m + round(span * progress), (self.spec.height - self._size) // 2


def encode_mp4(spec: VideoSpec, codec: str = "libx264") -> bytes:
    """The whole video as mp4 bytes that decord reads back frame for frame."""
    import av

    buffer = io.BytesIO()
    renderer = FrameRenderer(spec)
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream(codec, rate=_frame_rate(spec.fps))
        stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, "yuv420p"
        stream.codec_context.thread_count = 1
        if codec == "libx264":
            stream.codec_context.options = {"crf": "18", "preset": "veryfast", "x264-params": "mbtree=0"}
        else:
            stream.codec_context.bit_rate = 600_000
        for index in range(spec.n_frames):
            container.mux(stream.encode(yuv420p_frame(renderer.frame(index))))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def rgb_to_yuv420p(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BT.601 limited-range Y [H, W], Cb and Cr [H/2, W/2] (2x2 means) of an RGB image."""
    x = rgb.astype(np.float32)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    y = 16 + (65.481 * r + 128.553 * g + 24.966 * b) / 255
    cb = 128 + (-37.797 * r - 74.203 * g + 112.0 * b) / 255
    cr = 128 + (112.0 * r - 93.786 * g - 18.214 * b) / 255

    def half(plane: np.ndarray) -> np.ndarray:
        return 0.25 * (plane[0::2, 0::2] + plane[1::2, 0::2] + plane[0::2, 1::2] + plane[1::2, 1::2])

    return tuple(np.clip(np.round(p), 0, 255).astype(np.uint8) for p in (y, half(cb), half(cr)))


def yuv420p_frame(rgb: np.ndarray):
    """An `av.VideoFrame` whose three planes are written in full, edge-replicated into the padding."""
    import av

    frame = av.VideoFrame(rgb.shape[1], rgb.shape[0], "yuv420p")
    for plane, values in zip(frame.planes, rgb_to_yuv420p(rgb), strict=True):
        buffer = np.frombuffer(plane, dtype=np.uint8).reshape(plane.height, plane.line_size)
        width = values.shape[1]
        buffer[:, :width] = values
        buffer[:, width:] = values[:, -1:]
    return frame


def _frame_rate(fps: float):
    from fractions import Fraction

    return Fraction(fps).limit_denominator(1000)
