"""`fma_rate.widest_fma_ports`: the host's full-width multiply-adds a cycle, measured, carried
by the host's Target (and not by one `cpu_from` describes for other vectors or another CPU),
and what conv_costs makes of it: with one full-width FMA a cycle the direct conv's estimate
doubles and small 3x3 layers go to Winograd (cnn's 16->32 at 16x16 measured 1.3-1.8x faster
by it on Zen 4)."""

from dnnc.backends.llvm import fma_rate
from dnnc.backends.llvm.cpu import _host_cpu, cpu_from, host_target
from dnnc.ir.target import Target
from dnnc.passes.conv_costs import conv3x3_costs


def test_the_host_target_carries_the_measured_rate():
    name, features = _host_cpu()
    target = host_target()
    ports = fma_rate.widest_fma_ports(name, features, target.vector_bits)
    assert ports in (1, fma_rate.HALF_WIDTH_PORTS)
    assert target.fma_ports == ports


def test_a_cpu_described_for_other_vectors_keeps_the_default():
    assert cpu_from("x86-64-v3").fma_ports == Target.fma_ports
    assert cpu_from(None, "-avx512f").fma_ports == Target.fma_ports


def test_the_loop_ir_has_independent_chains():
    ir = fma_rate._loop("f", 16)
    assert ir.count("@llvm.fma.v16f32(<16 x float> %a") == fma_rate.CHAINS
    assert all(f"%s{k} = load" in ir for k in range(fma_rate.CHAINS))


def test_half_rate_full_width_fmas_send_small_layers_to_winograd():
    two = conv3x3_costs(1, 16, 32, 16, 16, 32, 512, 1, "fp32", 2)
    one = conv3x3_costs(1, 16, 32, 16, 16, 32, 512, 1, "fp32", 1)
    assert min(two, key=two.get) is None and min(one, key=one.get) == 2
    assert one[None] > 1.9 * two[None] and one[2] < 1.5 * two[2]
