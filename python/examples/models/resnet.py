"""A ResNet-18-style CNN (BasicBlocks [2, 2, 2, 2], batch norm, strided convs, global
average pooling) at small widths, for 32x32 images."""

import torch
import torch.nn as nn


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32, 64, 128), blocks=(2, 2, 2, 2), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                layers.append(BasicBlock(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(x.mean(dim=(2, 3)))


def resnet18(**kwargs):
    model = ResNet(**kwargs)
    # Non-trivial running statistics, so eval-mode batch norm is tested for real.
    g = torch.Generator().manual_seed(2)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1, generator=g)
            m.running_var.uniform_(0.8, 1.2, generator=g)
    return model


def resnet_inputs(batch=4):
    return (torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(3)),)
