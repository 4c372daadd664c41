"""Small torch modules the backend's and torch.export's tests share: a CNN with batch norms
and pools, a residual network, a pre-norm transformer block. Imports torch: only modules that
skipped without it import this one."""

import torch

nn = torch.nn


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, groups=2)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = nn.functional.avg_pool2d(torch.relu(self.bn2(self.conv2(x))), 2, ceil_mode=True)
        x = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return torch.log_softmax(self.fc(x), -1)


def randomize_batch_norm(module):
    """Running statistics that are not 0 and 1, so that folding them is tested."""
    gen = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
    return module


class Block(nn.Module):
    """A pre-norm transformer block: layer norm, softmax attention, gelu MLP."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x)), approximate="tanh"))


class Residual(nn.Module):
    """A ResNet basic block: two 3x3 conv-bn, the shortcut a strided 1x1 conv-bn where the
    shape changes."""

    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNetLike(nn.Module):
    """A stem, three residual stages (the last two strided), global pool, a classifier."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU(), nn.MaxPool2d(2))
        self.stages = nn.Sequential(Residual(16, 16), Residual(16, 32, 2), Residual(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
