"""`kiln bench vae` at the small preset: it decodes, its JSON says what it did, bad arguments are errors; on a
GPU, the PSNR of the CUDA decode against the CPU's is at least 60 dB in f32.

    python3 tests/tools/bench_vae_test.py KILN_BINARY"""
import json
import os
import subprocess
import sys
import tempfile


def run(kiln, *args):
    return subprocess.run([kiln, "bench", "vae", *args], capture_output=True, text=True, timeout=600)


def main():
    kiln = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "vae.json")
        r = run(kiln, "--preset", "small", "--device", "cpu", "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        j = json.load(open(out))
        # 3 latent frames, temporal x4; 12 x 16 latent pixels, spatial x8.
        assert (j["frames"], j["height"], j["width"]) == (12, 96, 128), j
        assert j["frames_per_s"] > 0 and j["peak_rss_bytes"] > 0, j
        # Another tiling and chunk count (a tile larger than the latent: one tile).
        r = run(kiln, "--preset", "small", "--device", "cpu", "--frames", "1", "--tile", "64")
        assert r.returncode == 0 and "decoded 4 frames" in r.stdout, r.stdout + r.stderr
        r = run(kiln, "--preset", "huge", "--device", "cpu")
        assert r.returncode != 0 and "unknown preset 'huge'" in r.stderr, r.stderr
        r = run(kiln, "--preset", "small", "--device", "cpu", "--dtype", "int8")
        assert r.returncode != 0 and "--dtype must be" in r.stderr, r.stderr
        info = subprocess.run([kiln, "info"], capture_output=True, text=True).stdout
        if "cuda:0:" in info:
            r = run(kiln, "--preset", "small", "--device", "cuda", "--json", out)
            assert r.returncode == 0, r.stdout + r.stderr
            j = json.load(open(out))
            assert j["psnr_db"] >= 60, j
            assert j["peak_driver_bytes"] >= j["peak_reserved_bytes"] >= j["peak_tensors_bytes"] > 0, j
        else:
            print("CUDA part skipped: no usable CUDA device")
    print("ok")


if __name__ == "__main__":
    main()
