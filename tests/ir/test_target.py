"""Target: one description of the machine; what the code may use follows from its feature
string, and a Target that cannot describe a machine is refused where it is made."""

import pytest

from dnnc.errors import ArgumentError, CompileError
from dnnc.ir.target import Target

AVX2 = "+avx,+avx2,-avx512f,+fma,+sse4.2"


@pytest.mark.parametrize("features,bits", [
    ("", 128), ("+sse4.2,-avx,-avx2", 128), (AVX2, 256), ("-avx,+avx2", 256),
    ("+avx2,+avx512f", 512), ("+neon,+fp-armv8", 128),
])
def test_feature_set_and_vector_width_follow_the_feature_string(features, bits):
    target = Target("llvm", "x86-64-v3", features)
    assert target.feature_set == {f[1:] for f in features.split(",") if f.startswith("+")}
    assert target.vector_bits == bits
    # the registry gives it the llvm templates' default panels: two vectors of float32
    from dnnc.backends.registry import REGISTRY

    packed = REGISTRY["llvm"].target(target)
    assert packed.panel("pack_dense") == packed.panel("pack_conv") == 2 * bits // 32


def test_a_layout_without_a_panel_width_is_refused():
    with pytest.raises(CompileError, match="no panel width for layout 'pack_dense'"):
        Target("llvm", layouts=("pack_dense",)).panel("pack_dense")


def test_a_target_is_frozen_and_hashable():
    a = Target("llvm", "znver3", AVX2, threads=2, layouts=("pack_dense",))
    assert a == Target("llvm", "znver3", AVX2, threads=2, layouts=("pack_dense",))
    assert len({a, Target("llvm", "znver3", AVX2, threads=2, layouts=("pack_dense",)),
                Target("llvm", "znver3", AVX2, threads=1, layouts=("pack_dense",))}) == 2
    with pytest.raises(AttributeError):
        a.threads = 4


@pytest.mark.parametrize("fields,message", [
    ({"threads": 0}, "Target threads must be a positive integer, not 0"),
    ({"threads": 2.0}, "Target threads must be a positive integer, not 2.0"),
    ({"threads": True}, "Target threads must be a positive integer, not True"),
    ({"features": "+avx,avx2"}, "Target features are signed .*, not 'avx2'"),
    ({"layouts": "pack_dense"}, "Target layouts is a tuple of names, not 'pack_dense'"),
])
def test_a_target_that_describes_no_machine_is_refused(fields, message):
    with pytest.raises(ArgumentError, match=message):
        Target("llvm", "znver3", **fields)
