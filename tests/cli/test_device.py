"""--device of the language-model commands (pretrain, convert, eval ppl, eval longctx):
the flag parses, a CUDA device without CUDA is refused naming --device before any work,
and the chosen device reaches the library call (the call itself replaced by a recorder;
CUDA's availability monkeypatched where a GPU is pretended)."""

from __future__ import annotations

import pytest
import torch

from pathattn.cli import build_parser, main
from tests._tiny_text import tiny_prepared

COMMANDS = {
    "pretrain": ["pretrain", "--data", "DATA", "--out", "OUT", "--steps", "1"],
    "convert": ["convert", "--teacher", "TEACHER", "--data", "DATA", "--out", "OUT"],
    "ppl": ["eval", "ppl", "--model", "MODEL", "--data", "DATA"],
    "longctx": ["eval", "longctx", "--model", "MODEL", "--task", "niah", "--lengths", "64"],
}


class Called(Exception):
    """Raised by the recorders: the command reached its library call."""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    pytest.importorskip("tokenizers")
    return tiny_prepared(tmp_path_factory.mktemp("device"))[1]


def argv(name: str, tmp_path, data, *extra: str) -> list[str]:
    subs = {"DATA": str(data), "OUT": str(tmp_path / "out"), "TEACHER": str(tmp_path),
            "MODEL": str(tmp_path)}
    return [subs.get(a, a) for a in COMMANDS[name]] + list(extra)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_flag_parses(name, tmp_path):
    args = build_parser().parse_args(argv(name, tmp_path, "d", "--device", "cuda:1"))
    assert args.device == "cuda:1"
    default = build_parser().parse_args(argv(name, tmp_path, "d")).device
    assert default == (None if name == "longctx" else "cpu")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_cuda_without_cuda_names_device(name, tmp_path, data, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        main(argv(name, tmp_path, data, "--device", "cuda"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--device" in err and "CUDA is not available" in err, err
    assert not (tmp_path / "out").exists()  # refused before any work


def _recorder(seen: dict, key: str = "device"):
    def record(*args, **kwargs):
        seen[key] = kwargs.get(key)
        raise Called

    return record


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_pretrain_threads_device(device, tmp_path, data, monkeypatch):
    import pathattn.train as train

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    seen = {}
    monkeypatch.setattr(train, "Trainer", _recorder(seen))
    with pytest.raises(Called):
        main(argv("pretrain", tmp_path, data, "--device", device))
    assert seen["device"] == torch.device(device)


def test_pretrain_torchrun_rank_gpu(tmp_path, data, monkeypatch):
    import pathattn.train as train

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setenv("LOCAL_RANK", "1")
    seen = {}
    monkeypatch.setattr(train, "Trainer", _recorder(seen))
    with pytest.raises(Called):
        main(argv("pretrain", tmp_path, data, "--device", "cuda"))
    assert seen["device"] == torch.device("cuda", 1)


def test_convert_threads_device(tmp_path, data, monkeypatch):
    import pathattn.convert as convert

    seen = {}
    monkeypatch.setattr(convert, "convert", _recorder(seen))
    with pytest.raises(Called):
        main(argv("convert", tmp_path, data, "--device", "cpu"))
    assert seen["device"] == torch.device("cpu")


def test_ppl_threads_device(tmp_path, data, monkeypatch):
    import pathattn.evaluation.ppl_models as ppl_models

    seen = {}
    monkeypatch.setattr(ppl_models, "evaluate_models", _recorder(seen))
    with pytest.raises(Called):
        main(argv("ppl", tmp_path, data, "--device", "cpu"))
    assert seen["device"] == torch.device("cpu")


def test_longctx_threads_device_and_dtype(tmp_path, data, monkeypatch):
    import pathattn.cli.eval as eval_cli
    import pathattn.evaluation.longctx as longctx

    seen = {}

    def load(folder, device):
        seen["device"] = device
        return "model", "tokenizer"

    monkeypatch.setattr(eval_cli, "load_model", load)
    monkeypatch.setattr(longctx, "evaluate_task", _recorder(seen, "dtype"))
    with pytest.raises(Called):
        main(argv("longctx", tmp_path, data, "--device", "cpu", "--dtype", "bfloat16"))
    assert seen == {"device": "cpu", "dtype": "bfloat16"}
