"""Real architectures from torchvision, timm and transformers, exported by torch's exporters.

    python bench/library_models.py OUT_DIR [--models efficientnet_b0,...] [--exporter torchscript|dynamo]

bench/torch_models.py writes architectures out in plain torch, for hosts without these
libraries. Where they are installed (the GPU machine's host has torchvision, timm and
transformers; beside the CPU torch build, `pip install --no-deps torchvision==0.28.0 timm`
works although the index's torchvision wheel is a CUDA build: see
dnnc.testing.optional.import_torchvision), this
module builds the libraries' own
modules, with random weights (seeded; no weights are downloaded, `weights=None` and config
objects only) and batch-norm statistics randomised so folding them is not a no-op, at batch 1
with a symbolic batch axis, and exports them. A model whose library is missing, or whose
export fails, is reported in one line and left out; the others go on (a failed export is
remembered beside the files, NAME.failed, and not tried again). With transformers 5 the
TorchScript exporter fails on the decoders (`aten::diff` in their mask code), and dynamo on
convnext_tiny (a guard on the batch size): the dynamo set has the decoders. Needs torch and
onnxscript; never a dependency of dnnc.

`bench/cpu.py --models library` (or `library-dynamo`) benchmarks them: exported once into
~/.cache/dnnc/bench/library-<exporter>/.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import torch_models
from torch_models import export_module, randomize_batchnorm

from dnnc.testing.optional import import_torchvision as _import_torchvision


def _torchvision(name: str):
    def make():
        return getattr(_import_torchvision().models, name)(weights=None)
    return make


def _timm(name: str):
    def make():
        _import_torchvision()   # timm imports it
        import timm

        return timm.create_model(name, pretrained=False)
    return make


class _Logits(nn.Module):
    """A transformers model called on token ids alone, returning one tensor (no cache, no
    dict): what an exported decoder or encoder computes for a prompt."""

    def __init__(self, model: nn.Module, decoder: bool):
        super().__init__()
        self.model, self.options = model, {"use_cache": False} if decoder else {}

    def forward(self, ids):
        out = self.model(input_ids=ids, return_dict=True, **self.options)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _transformers(config_name: str, model_name: str, decoder: bool, **config):
    def make():
        try:   # transformers imports torchvision where it is installed
            _import_torchvision()
        except ImportError:
            pass
        import transformers

        cfg = getattr(transformers, config_name)(**config)
        # eager attention: MatMul, Softmax, MatMul as most exported files have it (sdpa's
        # export differs between torch versions)
        cfg._attn_implementation = "eager"
        return _Logits(getattr(transformers, model_name)(cfg), decoder)
    return make


def _image():
    return torch.randn(1, 3, 224, 224)


def _tokens(seq: int):
    return lambda: torch.randint(0, 5000, (1, seq))


# name: (constructor, example input); the input's axis 0 is the symbolic batch
MODELS = {
    "resnet18_tv": (_torchvision("resnet18"), _image),
    "resnet50_tv": (_torchvision("resnet50"), _image),
    "mobilenet_v2_tv": (_torchvision("mobilenet_v2"), _image),
    "mobilenet_v3_small_tv": (_torchvision("mobilenet_v3_small"), _image),
    "efficientnet_b0": (_torchvision("efficientnet_b0"), _image),
    "shufflenet_v2": (_torchvision("shufflenet_v2_x1_0"), _image),
    "regnet_y_400mf": (_torchvision("regnet_y_400mf"), _image),
    "convnext_tiny": (_torchvision("convnext_tiny"), _image),
    "vit_tiny_timm": (_timm("vit_tiny_patch16_224"), _image),
    "mobilevit_xxs": (_timm("mobilevit_xxs"), _image),
    # 2 layers at each original's width; vocabularies cut to 5000 (an embedding gather and
    # the head's width, not the blocks, are what a vocabulary changes)
    "gpt2_hf": (_transformers("GPT2Config", "GPT2LMHeadModel", True, n_layer=2, n_embd=768,
                              n_head=12, vocab_size=5000, n_positions=128), _tokens(64)),
    "bert_hf": (_transformers("BertConfig", "BertModel", False, num_hidden_layers=2,
                              hidden_size=768, num_attention_heads=12,
                              intermediate_size=3072, vocab_size=5000), _tokens(128)),
    "llama_hf": (_transformers("LlamaConfig", "LlamaForCausalLM", True, num_hidden_layers=2,
                               hidden_size=512, intermediate_size=1376,
                               num_attention_heads=8, num_key_value_heads=8,
                               vocab_size=5000, max_position_embeddings=128), _tokens(64)),
}


def build(name: str) -> tuple[nn.Module, torch.Tensor]:
    """Model `name` with seeded random weights, in eval mode, and an example input."""
    make, example = MODELS[name]
    torch.manual_seed(0)
    model = make()   # the library's own initialisation, seeded
    model = randomize_batchnorm(model, torch.manual_seed(1)).eval()
    return model, example()


def export(name: str, path: Path, exporter: str = "torchscript") -> Path:
    """Export model `name` to `path` with one of torch's exporters (batch axis symbolic)."""
    model, x = build(name)
    return export_module(model, x, path, exporter, {0: "batch"})


def export_all(folder: Path, exporter: str, names=None, suffix: str = "") -> list[str]:
    """Every model of `names` (default: all) exported into `folder` once, as
    NAME`suffix`.onnx; those that cannot be built or exported here are reported and left out
    (torch_models.export_all)."""
    return torch_models.export_all(MODELS, export, folder, exporter, names, suffix)


if __name__ == "__main__":
    torch_models.cli(MODELS, export, __doc__)
