"""The decoder of `kiln bench vae` written in PyTorch, for the same run: frames/s and peak memory.

    python3 bench/torch_vae.py [--preset wan|small] [--device cuda|cpu] [--dtype f32|bf16|f16] [--json FILE]

The same architecture, tiling and causal chunking as tools/kiln/bench_vae.cpp (random weights from torch's own
generator: the timings and memory are comparable, the pixels are not). Peak memory: torch.cuda's
max_memory_allocated (tensors) and max_memory_reserved (its caching allocator)."""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

PRESETS = {
    "wan": dict(dims=[384, 192, 96, 96], time_up=[2, 2, 1], frames=21, height=90, width=160, tile=32),
    "small": dict(dims=[32, 16, 16, 8], time_up=[2, 2, 1], frames=3, height=12, width=16, tile=8),
}


def make_conv(cin, cout, dev, dt):
    w = torch.randn(cout, cin, 3, 3, 3) / math.sqrt(cin * 27)
    return w.to(dev, dt), (0.1 * torch.randn(cout)).to(dev, dt)


class TileDecoder:
    def __init__(self, model):
        self.m, self.caches, self.next = model, [], 0

    def conv(self, x, c):
        if self.next >= len(self.caches):
            self.caches.append(None)
        cache = self.caches[self.next]
        seq = torch.cat([cache, x], 2) if cache is not None else F.pad(x, (0, 0, 0, 0, 2, 0))
        self.caches[self.next] = seq[:, :, -2:].clone()
        self.next += 1
        return F.conv3d(F.pad(seq, (1, 1, 1, 1)), *c)

    def norm(self, x):
        return F.group_norm(x, min(32, x.shape[1]))

    def chunk(self, z):
        self.next = 0
        m = self.m
        x = self.conv(z, m["in"])
        for s, (a, b) in enumerate(m["blocks"]):
            x = x + self.conv(F.silu(self.norm(self.conv(F.silu(self.norm(x)), a))), b)
            if s + 1 < len(m["blocks"]):
                size = (x.shape[2] * m["time_up"][s], x.shape[3] * 2, x.shape[4] * 2)
                x = self.conv(F.interpolate(x, size=size, mode="trilinear", align_corners=False), m["up"][s])
        return self.conv(F.silu(self.norm(x)), m["out"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    ap.add_argument("--frames", type=int, default=0, help="latent frames (0: the preset's), as kiln bench vae --frames")
    ap.add_argument("--json")
    a = ap.parse_args()
    p, dev = PRESETS[a.preset], torch.device(a.device)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    # f32 as f32: kiln's f32 convolutions use no TF32 engines, so neither does the peer (PyTorch allows TF32 in
    # cuDNN convolutions by default).
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(1)
    dims = p["dims"]
    model = {"in": make_conv(16, dims[0], dev, dt), "time_up": p["time_up"], "out": make_conv(dims[-1], 3, dev, dt),
             "blocks": [(make_conv(d, d, dev, dt), make_conv(d, d, dev, dt)) for d in dims],
             "up": [make_conv(dims[s], dims[s + 1], dev, dt) for s in range(len(dims) - 1)]}
    scale = 2 ** (len(dims) - 1)
    latent_frames = a.frames or p["frames"]
    frames = latent_frames * math.prod(p["time_up"])
    z = torch.randn(1, 16, latent_frames, p["height"], p["width"]).to(dev, dt)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with torch.inference_mode():
        video = torch.empty(1, 3, frames, p["height"] * scale, p["width"] * scale, device=dev, dtype=dt)
        tile = p["tile"]
        for h0 in range(0, p["height"], tile):
            for w0 in range(0, p["width"], tile):
                td, f0 = TileDecoder(model), 0
                for t in range(latent_frames):
                    out = td.chunk(z[:, :, t:t + 1, h0:h0 + tile, w0:w0 + tile])
                    video[:, :, f0:f0 + out.shape[2], h0 * scale:h0 * scale + out.shape[3],
                          w0 * scale:w0 * scale + out.shape[4]] = out
                    f0 += out.shape[2]
    if dev.type == "cuda":
        torch.cuda.synchronize()
    s = time.perf_counter() - t0
    r = {"preset": a.preset, "device": str(dev), "dtype": a.dtype, "frames": frames, "seconds": s,
         "frames_per_s": frames / s, "torch": torch.__version__}
    print(f"torch {torch.__version__}: decoded {frames} frames in {s:.2f} s: {frames / s:.2f} frames/s")
    if dev.type == "cuda":
        r["peak_tensors_bytes"] = torch.cuda.max_memory_allocated()
        r["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        print(f"peak memory: tensors {r['peak_tensors_bytes'] / 2**30:.2f} GiB, reserved {r['peak_reserved_bytes'] / 2**30:.2f} GiB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
