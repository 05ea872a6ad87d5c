"""Bad arguments from Python: kiln.KilnError (a RuntimeError) with kiln's message, or TypeError naming the
argument; never a crash."""
import numpy as np
import pytest

import kiln


def test_kiln_errors_are_runtime_errors_with_kiln_messages():
    assert issubclass(kiln.KilnError, RuntimeError)
    assert issubclass(kiln.OutOfMemoryError, kiln.KilnError) and issubclass(kiln.OutOfMemoryError, MemoryError)
    with pytest.raises(kiln.KilnError, match=r"\[2, 3\].*\[4, 5\]"):
        kiln.mm(kiln.ones(2, 3), kiln.ones(4, 5))
    with pytest.raises(kiln.KilnError, match="broadcast"):
        kiln.ones(2, 3) + kiln.ones(4)
    with pytest.raises(kiln.KilnError):
        kiln.ones(6).view(4)
    with pytest.raises(kiln.KilnError):
        kiln.softmax(kiln.ones(2, 3), 5)
    with pytest.raises(kiln.KilnError):
        kiln.ones(2).to(kiln.float8_e4m3fn) + kiln.ones(2)  # float8 does not promote


def test_wrong_argument_types_are_type_errors():
    t = kiln.ones(2, 2)
    for call in [lambda: kiln.exp("x"), lambda: kiln.add(t, "x"), lambda: kiln.sum(t, dim="a"),
                 lambda: kiln.softmax(t, dim=1.5), lambda: kiln.zeros(2, dtype="not-a-dtype"),
                 lambda: kiln.zeros(2, device="tpu"), lambda: t.view("a"), lambda: kiln.linear(t, None),
                 lambda: kiln.tensor(object()), lambda: kiln.cat([t, 3])]:
        with pytest.raises(TypeError):
            call()
    with pytest.raises(TypeError, match="input"):
        kiln.exp(input=3)
    assert (t + np.float32(1)).tolist() == [[2, 2], [2, 2]]
    # An operand kiln does not know gives NotImplemented, so Python reports the operator's TypeError.
    with pytest.raises(TypeError):
        t + "x"
    with pytest.raises(TypeError):
        t @ 3


def test_devices_that_do_not_exist_are_errors():
    if kiln.cuda.is_available():
        with pytest.raises(kiln.KilnError):
            kiln.ones(2, device="cuda:64")
    else:
        with pytest.raises(kiln.KilnError, match="CUDA|cuda"):
            kiln.ones(2, device="cuda")
        with pytest.raises(kiln.KilnError):
            kiln.cuda.memory_stats()
        with pytest.raises(kiln.KilnError):
            kiln.cuda.Stream()


def test_extreme_sizes_do_not_crash():
    with pytest.raises((kiln.KilnError, MemoryError)):
        kiln.empty(2**62)
    with pytest.raises(kiln.KilnError):
        kiln.empty(-1)
    with pytest.raises((kiln.KilnError, TypeError, OverflowError)):
        kiln.zeros(2**70)
    assert kiln.ones(0, 5).sum().item() == 0


def test_model_and_tokenizer_errors(tmp_path):
    with pytest.raises(kiln.KilnError):
        kiln.Model.from_pretrained(str(tmp_path), device="cpu")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(kiln.KilnError, match="tokenizer.json"):
        kiln.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    with pytest.raises(kiln.KilnError):
        kiln.Model.from_preset("no-such-model", device="cpu")
