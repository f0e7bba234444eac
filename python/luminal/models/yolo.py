"""YOLO detectors (YOLOv8; YOLO11 in ``Yolo11``): a CSP backbone (Conv-BN-SiLU, C2f
blocks, SPPF), a PAN neck (nearest 2x upsampling, concatenation) and the anchor-free
decoupled head (per level a box branch predicting a distribution over ``reg_max`` distances
per side, and a class branch).

The graph runs everything up to decoded detections: output ``detections`` (batch, 4 + classes,
anchors) holds each anchor's box as centre x, centre y, width, height in input pixels
(distribution focal loss expectation, distances to the anchor point times the level's stride)
and its class probabilities (sigmoid), as ultralytics' ``Detect`` returns in eval mode.
``Detector.detect`` adds the confidence threshold and non-maximum suppression (data-dependent:
numpy on the graph's output).

Weights keep ultralytics' state-dict names (``model.<layer>.cv1.conv.weight``,
``model.<layer>.bn.running_var``, ``model.22.cv2.<level>.2.bias``), read from a folder with a
``config.json`` (``model_type: yolov8`` or ``yolo11``, ``nc``, ``depth_multiple``,
``width_multiple``, ``max_channels``, ``reg_max``, ``imgsz``) and safetensors. Batch norms
become a scale and shift of the convolution before them and are folded into its weights
before compiling.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..functional import cat, conv2d, max_pool2d, sigmoid, silu, softmax
from ..graph import symbolic as sym
from ..tensor import Graph, Tensor
from .base import DictWeights, Runner
from .decoder import F32Weights

# ultralytics' model scales: (depth multiple, width multiple, max channels)
SCALES = {"n": (0.33, 0.25, 1024), "s": (0.33, 0.50, 1024), "m": (0.67, 0.75, 768),
          "l": (1.00, 1.00, 512), "x": (1.00, 1.25, 512)}  # fmt: skip
SCALES_11 = {"n": (0.50, 0.25, 1024), "s": (0.50, 0.50, 1024), "m": (0.50, 1.00, 512),
             "l": (1.00, 1.00, 512), "x": (1.00, 1.50, 512)}  # fmt: skip
BN_EPS = 1e-3  # ultralytics' Conv uses BatchNorm2d(eps=0.001)


@dataclass
class YoloConfig:
    nc: int = 80
    depth_multiple: float = 0.33
    width_multiple: float = 0.25
    max_channels: int = 1024
    reg_max: int = 16
    imgsz: list[int] = field(default_factory=lambda: [640, 640])  # height, width
    num_channels: int = 3

    def __post_init__(self) -> None:
        if len(self.imgsz) != 2 or any(s <= 0 or s % 32 for s in self.imgsz):
            raise ValueError(f"yolo: imgsz must be [height, width], multiples of 32: {self.imgsz}")
        if self.nc < 1 or self.reg_max < 1:
            raise ValueError(f"yolo: nc and reg_max must be >= 1, got {self.nc}, {self.reg_max}")

    @staticmethod
    def from_dict(c: dict[str, Any], v11: bool = False) -> YoloConfig:
        scales = SCALES_11 if v11 else SCALES
        if c.get("scale") is not None:
            if c["scale"] not in scales:
                raise ValueError(f"yolo: scale {c['scale']!r} (known: {', '.join(scales)})")
            d, w, m = scales[c["scale"]]
        else:
            d, w, m = c.get("depth_multiple", 0.33), c.get("width_multiple", 0.25), 1024
        imgsz = c.get("imgsz", 640)
        imgsz = [imgsz, imgsz] if isinstance(imgsz, int) else list(imgsz)
        return YoloConfig(int(c.get("nc", 80)), float(d), float(w),
                          int(c.get("max_channels", m)), int(c.get("reg_max", 16)),
                          [int(s) for s in imgsz], int(c.get("num_channels", 3)))  # fmt: skip

    def ch(self, c: int) -> int:
        """Channels of a layer written for width 1 (ultralytics' make_divisible by 8)."""
        return int(math.ceil(min(c, self.max_channels) * self.width_multiple / 8) * 8)

    def n(self, k: int) -> int:
        return max(round(k * self.depth_multiple), 1) if k > 1 else k


class YoloV8:
    """The detection model; ``build()`` gives the graph (pixels -> detections)."""

    strides = (8, 16, 32)

    def __init__(self, config: YoloConfig, weights: Any) -> None:
        self.config = config
        self.weights = weights

    # -------------------------------------------------------------- modules
    def _conv(self, g: Graph, x: Tensor, p: str, stride: int = 1, act: bool = True) -> Tensor:
        """Conv (no bias) + batch norm + SiLU (``act``); the norm is a per-channel scale of
        the kernel and a shift (weight-only expressions, folded before compiling). Grouped
        (depthwise) when the kernel has fewer input channels than x."""
        w = self.weights
        k = w.get(g, p + "conv.weight")
        s = w.get(g, p + "bn.weight").mul(
            w.get(g, p + "bn.running_var").add(BN_EPS).sqrt().reciprocal()
        )
        shift = w.get(g, p + "bn.bias").add(w.get(g, p + "bn.running_mean").mul(s).mul(-1.0))
        ks, cin, cx = k.shape[-1], k.shape[1], x.shape[1]
        assert isinstance(ks, int) and isinstance(cin, int) and isinstance(cx, int)
        y = conv2d(x, k.mul(s.reshape(-1, 1, 1, 1)), shift, stride, ks // 2, 1, cx // cin)
        return silu(y) if act else y

    def _c2f(self, g: Graph, x: Tensor, p: str, n: int, shortcut: bool) -> Tensor:
        y = self._conv(g, x, p + "cv1.")
        half = y.shape[1]
        assert isinstance(half, int)
        ys = [y.slice(1, 0, half // 2), y.slice(1, half // 2, half // 2)]
        for i in range(n):  # bottlenecks on the last part, each output kept
            b = f"{p}m.{i}."
            h = self._conv(g, self._conv(g, ys[-1], b + "cv1."), b + "cv2.")
            ys.append(ys[-1].add(h) if shortcut else h)
        return self._conv(g, cat(ys, 1), p + "cv2.")

    def _sppf(self, g: Graph, x: Tensor, p: str) -> Tensor:
        ys = [self._conv(g, x, p + "cv1.")]
        for _ in range(3):
            ys.append(max_pool2d(ys[-1], 5, 1, 2))
        return self._conv(g, cat(ys, 1), p + "cv2.")

    # ---------------------------------------------------------------- graph
    def build(self, name: str = "yolov8") -> Graph:
        c = self.config
        g = Graph(name)
        batch = sym.dim("batch", 1, 1024)
        x = g.input("pixels", (batch, c.num_channels, *c.imgsz))
        m = "model."
        x = self._conv(g, x, m + "0.", 2)
        x = self._conv(g, x, m + "1.", 2)
        x = self._c2f(g, x, m + "2.", c.n(3), True)
        x = self._conv(g, x, m + "3.", 2)
        p3 = self._c2f(g, x, m + "4.", c.n(6), True)
        x = self._conv(g, p3, m + "5.", 2)
        p4 = self._c2f(g, x, m + "6.", c.n(6), True)
        x = self._conv(g, p4, m + "7.", 2)
        x = self._c2f(g, x, m + "8.", c.n(3), True)
        p5 = self._sppf(g, x, m + "9.")
        h4 = self._c2f(g, cat([_up2(p5), p4], 1), m + "12.", c.n(3), False)
        o3 = self._c2f(g, cat([_up2(h4), p3], 1), m + "15.", c.n(3), False)
        o4 = self._c2f(g, cat([self._conv(g, o3, m + "16.", 2), h4], 1), m + "18.", c.n(3), False)
        o5 = self._c2f(g, cat([self._conv(g, o4, m + "19.", 2), p5], 1), m + "21.", c.n(3), False)
        g.output("detections", self._detect(g, [o3, o4, o5], batch, m + "22."))
        return g

    def _detect(self, g: Graph, levels: list[Tensor], batch: Any, p: str) -> Tensor:
        c, w = self.config, self.weights
        rm = c.reg_max
        outs = []
        for i, x in enumerate(levels):
            box = self._conv(g, self._conv(g, x, f"{p}cv2.{i}.0."), f"{p}cv2.{i}.1.")
            box = conv2d(box, w.get(g, f"{p}cv2.{i}.2.weight"), w.get(g, f"{p}cv2.{i}.2.bias"))
            if w.has(f"{p}cv3.{i}.0.0.conv.weight"):  # YOLO11: depthwise + pointwise pairs
                cls = x
                for j in range(2):
                    cls = self._conv(
                        g, self._conv(g, cls, f"{p}cv3.{i}.{j}.0."), f"{p}cv3.{i}.{j}.1."
                    )
            else:
                cls = self._conv(g, self._conv(g, x, f"{p}cv3.{i}.0."), f"{p}cv3.{i}.1.")
            cls = conv2d(cls, w.get(g, f"{p}cv3.{i}.2.weight"), w.get(g, f"{p}cv3.{i}.2.bias"))
            hw = x.shape[2] * x.shape[3]
            outs.append(cat([box, cls], 1).reshape(batch, 4 * rm + c.nc, hw))
        y = cat(outs, 2)  # (batch, 4 reg_max + nc, anchors)
        anchors, strides = self._anchors()
        n = anchors.shape[1]
        box, cls = y.slice(1, 0, 4 * rm), y.slice(1, 4 * rm, c.nc)
        # distribution focal loss: the expected bin of each side's softmax over reg_max bins
        bins = softmax(box.reshape(batch, 4, rm, n), 2)
        proj = (
            w.get(g, p + "dfl.conv.weight").reshape(1, 1, rm, 1)
            if w.has(p + "dfl.conv.weight")
            else g.tensor(np.arange(rm, dtype=np.float32).reshape(1, 1, rm, 1))
        )
        dist = bins.mul(proj).sum_reduce(2)  # (batch, 4, anchors): left, top, right, bottom
        lt, rb = dist.slice(1, 0, 2), dist.slice(1, 2, 2)
        a = g.tensor(anchors.reshape(1, 2, n))
        st = g.tensor(strides.reshape(1, 1, n))
        xy = a.add(rb.add(lt.mul(-1.0)).mul(0.5)).mul(st)  # centre
        wh = lt.add(rb).mul(st)
        return cat([xy, wh, sigmoid(cls)], 1)

    def _anchors(self) -> tuple[np.ndarray, np.ndarray]:
        """Anchor points (2, anchors) at cell centres in grid units, and each one's stride."""
        h, w = self.config.imgsz
        pts, strides = [], []
        for s in self.strides:
            yy, xx = np.meshgrid(np.arange(h // s) + 0.5, np.arange(w // s) + 0.5, indexing="ij")
            pts.append(np.stack([xx.ravel(), yy.ravel()]))
            strides.append(np.full(xx.size, s))
        return (np.concatenate(pts, 1).astype(np.float32),
                np.concatenate(strides).astype(np.float32))  # fmt: skip


def _up2(x: Tensor) -> Tensor:
    """Nearest-neighbour 2x upsampling of (batch, c, h, w): a broadcast, no copy."""
    b, c, h, w = x.shape
    big = (b, c, h, 2, w, 2)
    return x.unsqueeze(3).unsqueeze(5).expand(big).reshape(b, c, 2 * h, 2 * w)


def yolo_from_dir(config: dict[str, Any], arrays: dict[str, np.ndarray]) -> YoloV8:
    cls = Yolo11 if config.get("model_type") == "yolo11" else YoloV8
    return cls(YoloConfig.from_dict(config, config.get("model_type") == "yolo11"),
               F32Weights(DictWeights(arrays)))  # fmt: skip


def nms(
    detections: np.ndarray, conf: float = 0.25, iou: float = 0.45, max_det: int = 300
) -> list[np.ndarray]:
    """Per image, the kept detections (n, 6): x1, y1, x2, y2, score, class, best first. A box
    takes its best class; boxes under ``conf`` are dropped; greedy non-maximum suppression
    within each class removes boxes overlapping a better one by more than ``iou``."""
    d = np.asarray(detections, np.float32)
    if d.ndim != 3 or d.shape[1] < 5:
        raise ValueError(f"nms: detections must be (batch, 4 + classes, anchors), got {d.shape}")
    out = []
    for img in d:
        scores = img[4:].max(0)
        cls = img[4:].argmax(0)
        keep = scores > conf
        xywh, scores, cls = img[:4, keep].T, scores[keep], cls[keep]
        boxes = np.concatenate([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], 1)
        order = np.argsort(-scores, kind="stable")
        kept: list[int] = []
        for i in order:
            if len(kept) >= max_det:
                break
            same = [k for k in kept if cls[k] == cls[i]]
            if same and _iou(boxes[i], boxes[same]).max() > iou:
                continue
            kept.append(int(i))
        k = np.asarray(kept, np.int64)
        out.append(np.concatenate([boxes[k], scores[k, None], cls[k, None].astype(np.float32)], 1))
    return out


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    lo = np.maximum(box[:2], others[:, :2])
    hi = np.minimum(box[2:], others[:, 2:])
    inter = np.clip(hi - lo, 0, None).prod(1)
    area = (box[2:] - box[:2]).prod()
    areas = (others[:, 2:] - others[:, :2]).prod(1)
    return inter / np.maximum(area + areas - inter, 1e-9)


class Detector:
    """A detector ready to run: ``forward(pixels)`` -> detections (batch, 4 + classes,
    anchors); ``detect(pixels, conf, iou)`` -> per image (n, 6) boxes after NMS."""

    def __init__(self, model: YoloV8, backend: str = "auto", quiet: bool = True) -> None:
        from ..compiler.fold import fold_weights

        self.model = model
        self.config = model.config
        ident = getattr(model.weights, "identity", None)
        key = None
        if ident is not None:
            key = {"model": "YoloV8", "config": asdict(model.config), "weights": ident()}
        self.runner = Runner(lambda: fold_weights(model.build()), backend, quiet, key=key,
                             name="yolov8")  # fmt: skip
        self.graph = self.runner.graph

    @property
    def backend(self) -> str:
        return self.runner.backend

    def forward(self, pixels: np.ndarray) -> np.ndarray:
        x = np.asarray(pixels, np.float32)
        c = self.config
        want = (c.num_channels, *c.imgsz)
        if x.ndim != 4 or x.shape[1:] != want:
            raise ValueError(f"pixels must be (batch, {', '.join(map(str, want))}), got {x.shape}")
        return self.runner({"pixels": x})["detections"]

    __call__ = forward

    def detect(self, pixels: np.ndarray, conf: float = 0.25, iou: float = 0.45) -> list[np.ndarray]:
        return nms(self.forward(pixels), conf, iou)


class Yolo11(YoloV8):
    """YOLO11 (ultralytics' yolo11.yaml): C3k2 blocks (C2f whose inner blocks are
    bottlenecks or, where the weights hold them, C3k blocks), SPPF then C2PSA (attention over
    the stride-32 grid), the same PAN neck, and a detect head whose class branch is depthwise
    + pointwise convolutions. Layers 0-23; concat sources 6, 4, 13, 10."""

    def _bottleneck(self, g: Graph, x: Tensor, p: str) -> Tensor:
        return x.add(self._conv(g, self._conv(g, x, p + "cv1."), p + "cv2."))

    def _c3k2(self, g: Graph, x: Tensor, p: str, n: int) -> Tensor:
        y = self._conv(g, x, p + "cv1.")
        half = y.shape[1]
        assert isinstance(half, int)
        ys = [y.slice(1, 0, half // 2), y.slice(1, half // 2, half // 2)]
        for i in range(n):
            b = f"{p}m.{i}."
            if self.weights.has(b + "m.0.cv1.conv.weight"):  # C3k: a C3 of two bottlenecks
                h = self._conv(g, ys[-1], b + "cv1.")
                for j in range(2):
                    h = self._bottleneck(g, h, f"{b}m.{j}.")
                h = self._conv(g, cat([h, self._conv(g, ys[-1], b + "cv2.")], 1), b + "cv3.")
            else:
                h = self._bottleneck(g, ys[-1], b)
            ys.append(h)
        return self._conv(g, cat(ys, 1), p + "cv2.")

    def _c2psa(self, g: Graph, x: Tensor, p: str, n: int) -> Tensor:
        y = self._conv(g, x, p + "cv1.")
        c2 = y.shape[1]
        assert isinstance(c2, int)
        c = c2 // 2
        a, b = y.slice(1, 0, c), y.slice(1, c, c)
        for i in range(n):
            q = f"{p}m.{i}."
            b = b.add(self._psa_attention(g, b, q + "attn.", c))
            b = b.add(self._conv(g, self._conv(g, b, q + "ffn.0."), q + "ffn.1.", act=False))
        return self._conv(g, cat([a, b], 1), p + "cv2.")

    def _psa_attention(self, g: Graph, x: Tensor, p: str, dim: int) -> Tensor:
        heads = dim // 64  # ultralytics' rule; the weights do not say
        if heads < 1:
            raise ValueError(f"yolo11: C2PSA over {dim} channels has no attention head (< 64)")
        hd = dim // heads
        kd = int(hd * 0.5)
        b, _, h, w = x.shape
        n = h * w
        qkv = self._conv(g, x, p + "qkv.", act=False).reshape(b, heads, 2 * kd + hd, n)
        q, k, v = qkv.slice(2, 0, kd), qkv.slice(2, kd, kd), qkv.slice(2, 2 * kd, hd)
        attn = softmax(q.permute(0, 1, 3, 2).matmul(k).mul(kd**-0.5), -1)  # (b, heads, n, n)
        out = v.matmul(attn.permute(0, 1, 3, 2)).reshape(b, dim, h, w)
        out = out.add(self._conv(g, v.reshape(b, dim, h, w), p + "pe.", act=False))
        return self._conv(g, out, p + "proj.", act=False)

    def build(self, name: str = "yolo11") -> Graph:
        c = self.config
        g = Graph(name)
        batch = sym.dim("batch", 1, 1024)
        x = g.input("pixels", (batch, c.num_channels, *c.imgsz))
        m, n = "model.", c.n(2)
        x = self._conv(g, self._conv(g, x, m + "0.", 2), m + "1.", 2)
        x = self._c3k2(g, x, m + "2.", n)
        p3 = self._c3k2(g, self._conv(g, x, m + "3.", 2), m + "4.", n)
        p4 = self._c3k2(g, self._conv(g, p3, m + "5.", 2), m + "6.", n)
        x = self._c3k2(g, self._conv(g, p4, m + "7.", 2), m + "8.", n)
        p5 = self._c2psa(g, self._sppf(g, x, m + "9."), m + "10.", n)
        h4 = self._c3k2(g, cat([_up2(p5), p4], 1), m + "13.", n)
        o3 = self._c3k2(g, cat([_up2(h4), p3], 1), m + "16.", n)
        o4 = self._c3k2(g, cat([self._conv(g, o3, m + "17.", 2), h4], 1), m + "19.", n)
        o5 = self._c3k2(g, cat([self._conv(g, o4, m + "20.", 2), p5], 1), m + "22.", n)
        g.output("detections", self._detect(g, [o3, o4, o5], batch, m + "23."))
        return g
