"""Graph passes, one module each (`fuse_quantized`, `fold_constants`/`specialize`, `simplify`,
`eliminate`, `widen_half`, `fuse_attention`, `store_half`, `expand_powers` (Pow by 2 and 3 as
multiplies), `convert_layout` with `sink_transposes`, `conv_costs` (its estimate of each conv
algorithm's time) and `find_sparsity` (products with sparse constant weights as sparse ops, by
its estimate; on a GPU at fp16 / bf16 `sparse24`'s rewrite of 2:4 weights), `store_tf32` (at tf32, what tensor-core products read stored as tf32 values), `sink_updates` (an
in-place update of an input after the input's other readers), `take_range` (a dynamic
quantization's range taken where its input is made), `fuse_ops`), and `manager.py`: the
pipeline per opt level, which verifies,
times and dumps the graph after every pass (docs/passes.md)."""
