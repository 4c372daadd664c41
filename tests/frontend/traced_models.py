"""NumPy functions the tracing and export tests run as themselves and traced: the models of
the tracing issue, written as users write them (methods and functions of NumPy alike)."""

import math

import numpy as np


def f32(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def layernorm(x, gamma, beta):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * gamma + beta


def mlp(x, w1, b1, w2, b2):
    h = np.maximum(x @ w1 + b1, 0.0)
    return softmax(h @ w2 + b2)


def attention(q, k, v):
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    return softmax(scores) @ v


def variance(a):
    """nervanagpu's one-kernel variance expression."""
    return np.mean(np.square(a - np.mean(a, axis=1, keepdims=True)), axis=1)


def batchnorm(x, gamma, beta):
    """Batch normalisation by the batch's mean and variance (axis 0)."""
    mean = np.mean(x, axis=0, keepdims=True)
    var = np.var(x, axis=0, keepdims=True)
    return gamma * (x - mean) / np.sqrt(var + 1e-5) + beta
