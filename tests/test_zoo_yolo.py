"""The YOLOv8-style detector (``models/yolo.py``) against a PyTorch reference written here
the way ultralytics writes its modules (Conv-BN-SiLU, C2f, SPPF, upsample + concat neck,
the decoupled ``Detect`` head with DFL decoding; YOLO11's C3k2, C2PSA and depthwise head),
with ultralytics' state-dict names: random
weights and batch-norm statistics, saved as safetensors + config.json, loaded with
``luminal.models.load``; decoded detections equal (interpreter and compiled), and NMS."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from luminal.models import load  # noqa: E402
from luminal.models.yolo import Detector, YoloConfig, nms  # noqa: E402
from test_zoo_decoders import _rel, fast_compile, needs_compiled  # noqa: E402, F401


class Conv(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, g: int = 1,
                 act: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, groups=g, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=0.001, momentum=0.03)
        self.act = act

    def forward(self, x):
        y = self.bn(self.conv(x))
        return nn.functional.silu(y) if self.act else y


class Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool, e: float = 1.0) -> None:
        super().__init__()
        h = int(c * e)
        self.cv1, self.cv2, self.add = Conv(c, h, 3), Conv(h, c, 3), shortcut

    def forward(self, x):
        return x + self.cv2(self.cv1(x)) if self.add else self.cv2(self.cv1(x))


class C2f(nn.Module):
    def __init__(self, c1: int, c2: int, n: int, shortcut: bool) -> None:
        super().__init__()
        self.c = c2 // 2
        self.cv1, self.cv2 = Conv(c1, 2 * self.c), Conv((2 + n) * self.c, c2)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1: int, c2: int) -> None:
        super().__init__()
        self.cv1, self.cv2 = Conv(c1, c1 // 2), Conv(c1 // 2 * 4, c2)
        self.m = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class Detect(nn.Module):
    def __init__(self, nc: int, ch: list[int], strides: list[int], reg_max: int = 16,
                 legacy: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.nc, self.reg_max, self.no, self.strides = nc, reg_max, nc + 4 * reg_max, strides
        c2, c3 = max(16, ch[0] // 4, reg_max * 4), max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(x, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1))
            for x in ch
        )
        if legacy:  # YOLOv8
            self.cv3 = nn.ModuleList(
                nn.Sequential(Conv(x, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for x in ch
            )
        else:  # YOLO11: depthwise (DWConv) + pointwise pairs
            self.cv3 = nn.ModuleList(
                nn.Sequential(nn.Sequential(Conv(x, x, 3, g=x), Conv(x, c3, 1)),
                              nn.Sequential(Conv(c3, c3, 3, g=c3), Conv(c3, c3, 1)),
                              nn.Conv2d(c3, nc, 1))
                for x in ch
            )  # fmt: skip
        self.dfl = nn.Module()
        self.dfl.conv = nn.Conv2d(reg_max, 1, 1, bias=False).requires_grad_(False)
        self.dfl.conv.weight.data[:] = torch.arange(reg_max, dtype=torch.float).view(1, -1, 1, 1)

    def forward(self, xs):
        b = xs[0].shape[0]
        x = torch.cat([torch.cat((self.cv2[i](xi), self.cv3[i](xi)), 1).view(b, self.no, -1)
                       for i, xi in enumerate(xs)], 2)  # fmt: skip
        pts, st = [], []
        for xi, s in zip(xs, self.strides, strict=True):
            h, w = xi.shape[2:]
            sy, sx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
            pts.append(torch.stack((sx, sy), -1).view(-1, 2))
            st.append(torch.full((h * w, 1), float(s)))
        anchors, strides = torch.cat(pts).T.unsqueeze(0), torch.cat(st).T
        box, cls = x.split((4 * self.reg_max, self.nc), 1)
        a = box.shape[2]
        dist = self.dfl.conv(box.view(b, 4, self.reg_max, a).transpose(2, 1).softmax(1))
        lt, rb = dist.view(b, 4, a).chunk(2, 1)
        x1y1, x2y2 = anchors - lt, anchors + rb
        dbox = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * strides
        return torch.cat((dbox, cls.sigmoid()), 1)


class YoloRef(nn.Module):
    """YOLOv8 as ultralytics' yolov8.yaml lays it out (layers 0-22, concat sources 6/4/12/9)."""

    def __init__(self, cfg: YoloConfig) -> None:
        super().__init__()
        c, n = cfg.ch, cfg.n
        c3, c4, c5 = c(256), c(512), c(1024)
        layers = [
            Conv(3, c(64), 3, 2), Conv(c(64), c(128), 3, 2), C2f(c(128), c(128), n(3), True),
            Conv(c(128), c(256), 3, 2), C2f(c(256), c(256), n(6), True),
            Conv(c(256), c(512), 3, 2), C2f(c(512), c(512), n(6), True),
            Conv(c(512), c5, 3, 2), C2f(c5, c5, n(3), True), SPPF(c5, c5),
            nn.Upsample(None, 2, "nearest"), nn.Identity(), C2f(c5 + c4, c4, n(3), False),
            nn.Upsample(None, 2, "nearest"), nn.Identity(), C2f(c4 + c3, c3, n(3), False),
            Conv(c3, c3, 3, 2), nn.Identity(), C2f(c3 + c4, c4, n(3), False),
            Conv(c4, c4, 3, 2), nn.Identity(), C2f(c4 + c5, c5, n(3), False),
            Detect(cfg.nc, [c3, c4, c5], [8, 16, 32], cfg.reg_max),
        ]  # fmt: skip
        self.model = nn.ModuleList(layers)

    def forward(self, x):
        m, saved = self.model, {}
        for i in range(10):
            x = m[i](x)
            saved[i] = x
        for i, src in ((11, 6), (14, 4), (17, 12), (20, 9)):
            x = m[i + 1](torch.cat([m[i - 1](x), saved[src]], 1))
            saved[i + 1] = x
        return m[22]([saved[15], saved[18], saved[21]])


class C3k(nn.Module):
    def __init__(self, c1: int, c2: int) -> None:
        super().__init__()
        h = c2 // 2
        self.cv1, self.cv2, self.cv3 = Conv(c1, h), Conv(c1, h), Conv(2 * h, c2)
        self.m = nn.Sequential(Bottleneck(h, True), Bottleneck(h, True))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C3k2(nn.Module):
    def __init__(self, c1: int, c2: int, n: int, c3k: bool, e: float = 0.5) -> None:
        super().__init__()
        self.c = int(c2 * e)
        self.cv1, self.cv2 = Conv(c1, 2 * self.c), Conv((2 + n) * self.c, c2)
        self.m = nn.ModuleList(
            C3k(self.c, self.c) if c3k else Bottleneck(self.c, True, 0.5) for _ in range(n)
        )

    forward = C2f.forward


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.kd = int(self.hd * 0.5)
        self.qkv = Conv(dim, dim + 2 * self.kd * heads, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, g=dim, act=False)

    def forward(self, x):
        b, c, h, w = x.shape
        qkv = self.qkv(x).view(b, self.heads, 2 * self.kd + self.hd, h * w)
        q, k, v = qkv.split([self.kd, self.kd, self.hd], dim=2)
        attn = ((q.transpose(-2, -1) @ k) * self.kd**-0.5).softmax(dim=-1)
        x = (v @ attn.transpose(-2, -1)).view(b, c, h, w) + self.pe(v.reshape(b, c, h, w))
        return self.proj(x)


class PSABlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.attn = Attention(c, c // 64)
        self.ffn = nn.Sequential(Conv(c, 2 * c), Conv(2 * c, c, act=False))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.ffn(x)


class C2PSA(nn.Module):
    def __init__(self, c1: int, n: int) -> None:
        super().__init__()
        self.c = c1 // 2
        self.cv1, self.cv2 = Conv(c1, 2 * self.c), Conv(2 * self.c, c1)
        self.m = nn.Sequential(*(PSABlock(self.c) for _ in range(n)))

    def forward(self, x):
        a, b = self.cv1(x).split((self.c, self.c), 1)
        return self.cv2(torch.cat((a, self.m(b)), 1))


class Yolo11Ref(nn.Module):
    """YOLO11 as ultralytics' yolo11.yaml lays it out (layers 0-23, concat sources 6/4/13/10)."""

    def __init__(self, cfg: YoloConfig) -> None:
        super().__init__()
        c, n = cfg.ch, cfg.n(2)
        c3, c4, c5 = c(256), c(512), c(1024)
        up = nn.Upsample(None, 2, "nearest")
        layers = [
            Conv(3, c(64), 3, 2), Conv(c(64), c(128), 3, 2), C3k2(c(128), c3, n, False, 0.25),
            Conv(c3, c3, 3, 2), C3k2(c3, c4, n, False, 0.25), Conv(c4, c4, 3, 2),
            C3k2(c4, c4, n, True), Conv(c4, c5, 3, 2), C3k2(c5, c5, n, True), SPPF(c5, c5),
            C2PSA(c5, n), up, nn.Identity(), C3k2(c5 + c4, c4, n, False), up, nn.Identity(),
            C3k2(c4 + c4, c3, n, False), Conv(c3, c3, 3, 2), nn.Identity(),
            C3k2(c3 + c4, c4, n, False), Conv(c4, c4, 3, 2), nn.Identity(),
            C3k2(c4 + c5, c5, n, True),
            Detect(cfg.nc, [c3, c4, c5], [8, 16, 32], cfg.reg_max, legacy=False),
        ]  # fmt: skip
        self.model = nn.ModuleList(layers)

    def forward(self, x):
        m, saved = self.model, {}
        for i in range(11):
            x = m[i](x)
            saved[i] = x
        for i, src in ((12, 6), (15, 4), (18, 13), (21, 10)):
            x = m[i + 1](torch.cat([m[i - 1](x), saved[src]], 1))
            saved[i + 1] = x
        return m[23]([saved[16], saved[19], saved[22]])


CFG = dict(model_type="yolov8", nc=5, depth_multiple=0.33, width_multiple=0.0625, reg_max=16,
           imgsz=[64, 96])  # fmt: skip


CFG11 = dict(CFG, model_type="yolo11", depth_multiple=0.5, width_multiple=0.125)


def _make(tmp_path, cfg: dict = CFG) -> torch.nn.Module:
    from luminal.loaders.safetensors import save_safetensors

    torch.manual_seed(0)
    v11 = cfg["model_type"] == "yolo11"
    ref = (Yolo11Ref if v11 else YoloRef)(YoloConfig.from_dict(cfg, v11)).eval()
    with torch.no_grad():  # batch norms with real statistics, so folding them shows
        for name, b in ref.named_buffers():
            if name.endswith("running_mean"):
                b.normal_(0, 0.3)
            elif name.endswith("running_var"):
                b.uniform_(0.5, 2.0)
        for name, p in ref.named_parameters():
            if ".bn." in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
            elif name.endswith(".2.bias"):
                p.normal_(0, 1.0)
    sd = {k: v.numpy() for k, v in ref.state_dict().items() if "num_batches" not in k}
    save_safetensors(tmp_path / "model.safetensors", sd)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return ref


def _pixels(batch: int) -> np.ndarray:
    return np.random.default_rng(batch).uniform(0, 1, (batch, 3, 64, 96)).astype(np.float32)


def _ref(ref, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return ref(torch.from_numpy(x)).numpy()


def test_yolo_matches_reference(tmp_path) -> None:
    ref = _make(tmp_path)
    d = load(tmp_path, backend="interp")
    assert isinstance(d, Detector) and d.backend == "interp"
    x = _pixels(2)
    want = _ref(ref, x)
    assert want.shape == (2, 4 + 5, 8 * 12 + 4 * 6 + 2 * 3)
    got = d.forward(x)
    assert _rel(got, want) <= 1e-4
    with pytest.raises(ValueError, match=r"pixels must be \(batch, 3, 64, 96\)"):
        d.forward(np.zeros((1, 3, 64, 64), np.float32))


def test_yolo11_matches_reference(tmp_path) -> None:
    """YOLO11: C3k2 with bottleneck and C3k inner blocks, C2PSA attention, depthwise head."""
    ref = _make(tmp_path, CFG11)
    d = load(tmp_path, backend="interp")
    assert type(d.model).__name__ == "Yolo11"
    x = _pixels(2)
    assert _rel(d.forward(x), _ref(ref, x)) <= 1e-4


@needs_compiled
@pytest.mark.slow
@pytest.mark.usefixtures("fast_compile")
@pytest.mark.parametrize("cfg", [CFG, CFG11], ids=["yolov8", "yolo11"])
def test_yolo_compiled_matches_reference(tmp_path, cfg: dict) -> None:
    ref = _make(tmp_path, cfg)
    d = load(tmp_path, backend="compiled")
    assert d.backend == "compiled"
    for batch in (1, 3):
        x = _pixels(batch)
        assert _rel(d.forward(x), _ref(ref, x)) <= 1e-4


def test_nms() -> None:
    """Best box first; an overlapping box of the same class goes, one of another class and a
    distant one of the same class stay; boxes under the threshold go."""
    boxes = np.array([[10, 10, 8, 8], [11, 10, 8, 8], [11, 10, 8, 8], [40, 40, 6, 6],
                      [70, 70, 4, 4]], np.float32).T  # fmt: skip  # cx, cy, w, h
    scores = np.zeros((2, 5), np.float32)
    scores[0, [0, 1, 3]] = [0.6, 0.9, 0.5]
    scores[1, 2] = 0.8
    scores[0, 4] = 0.1
    out = nms(np.concatenate([boxes, scores])[None], conf=0.25, iou=0.45)
    assert len(out) == 1
    np.testing.assert_allclose(out[0][:, 4], [0.9, 0.8, 0.5])
    np.testing.assert_array_equal(out[0][:, 5], [0, 1, 0])
    np.testing.assert_allclose(out[0][0, :4], [7, 6, 15, 14])
    with pytest.raises(ValueError, match="batch, 4 \\+ classes"):
        nms(np.zeros((3, 4)))


def test_bad_config() -> None:
    with pytest.raises(ValueError, match="multiples of 32"):
        YoloConfig.from_dict({"imgsz": [64, 90]})
    with pytest.raises(ValueError, match="scale 'q'"):
        YoloConfig.from_dict({"scale": "q"})
