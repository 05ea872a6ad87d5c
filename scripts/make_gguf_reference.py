"""Writes tests/data/gguf/types.gguf (one small tensor of every type kiln reads, plus metadata of every value
type) with llama.cpp's gguf-py, and tests/data/gguf/types.ref.safetensors: each tensor dequantised to f32 by
gguf-py's own reference code. tests/io/gguf_test.cpp compares kiln's reader against it.

    pip install gguf safetensors numpy && python3 scripts/make_gguf_reference.py"""
import os

import gguf
import numpy as np
from gguf.quants import dequantize, quantize
from safetensors.numpy import save_file

T = gguf.GGMLQuantizationType
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "gguf")


def main():
    rng = np.random.default_rng(7)
    os.makedirs(OUT, exist_ok=True)
    w = gguf.GGUFWriter(os.path.join(OUT, "types.gguf"), arch="llama")
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -7)
    w.add_float32("test.f32", 0.25)
    w.add_float64("test.f64", -1.5e300)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "kiln ✓")
    w.add_array("test.strings", ["a", "bc", ""])
    w.add_array("test.ints", [1, 2, 3])
    w.add_uint64("test.u64", 2 ** 63 + 5)
    ref = {}
    # Quantised types: random floats quantised with gguf-py where it can, else random blocks with sane scales.
    for qt, shape in [(T.F32, (3, 5)), (T.F16, (2, 7)), (T.BF16, (4, 3)), (T.Q8_0, (3, 64)), (T.Q4_0, (2, 96)),
                      (T.Q4_1, (2, 64)), (T.Q5_0, (3, 32)), (T.Q5_1, (2, 64)), (T.Q4_K, (2, 256)), (T.Q5_K, (2, 512)),
                      (T.Q6_K, (3, 256))]:
        x = rng.standard_normal(shape).astype(np.float32)
        try:
            data = quantize(x, qt)
        except NotImplementedError:
            block, nbytes = gguf.GGML_QUANT_SIZES[qt]
            nblocks = x.size // block
            raw = rng.integers(0, 256, (nblocks, nbytes), dtype=np.uint8)
            # d and dmin (the first 4 bytes of the K-quants, the last 2 of Q6_K) as small positive halves.
            scales = (rng.random((nblocks, 2)) * 0.05 + 0.01).astype(np.float16).view(np.uint8)
            if qt == T.Q6_K:
                raw[:, -2:] = scales[:, :2]
            else:
                raw[:, :4] = scales
            data = raw.reshape(shape[0], -1)
        name = f"t.{qt.name.lower()}"
        w.add_tensor(name, data, raw_dtype=qt)
        ref[name] = dequantize(data, qt).astype(np.float32).reshape(shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file(ref, os.path.join(OUT, "types.ref.safetensors"))
    print("wrote", os.path.join(OUT, "types.gguf"), os.path.getsize(os.path.join(OUT, "types.gguf")), "bytes")


if __name__ == "__main__":
    main()
