"""The LLVM CPU backend: schedules, the LLVM IR renderer and the JIT runtime."""
