"""Testing tools shipped with dnnc: the differential fuzzer (`python -m dnnc.testing.fuzz`),
its random graph generator (`generate`) and its failure minimiser (`minimize`)."""
