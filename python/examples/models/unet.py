"""A small UNet: two down levels (conv-GroupNorm-SiLU, max pooling), a bottleneck, two
up levels (transposed convs, skip concatenation), a 1x1 head."""

import torch
import torch.nn as nn


def conv_block(cin, cout):
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1),
        nn.GroupNorm(4, cout),
        nn.SiLU(),
        nn.Conv2d(cout, cout, 3, padding=1),
        nn.GroupNorm(4, cout),
        nn.SiLU(),
    )


class UNet(nn.Module):
    def __init__(self, cin=3, cout=2, width=16):
        super().__init__()
        w = width
        self.d1, self.d2 = conv_block(cin, w), conv_block(w, 2 * w)
        self.mid = conv_block(2 * w, 4 * w)
        self.u2, self.c2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2), conv_block(4 * w, 2 * w)
        self.u1, self.c1 = nn.ConvTranspose2d(2 * w, w, 2, stride=2), conv_block(2 * w, w)
        self.head = nn.Conv2d(w, cout, 1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(self.pool(a))
        m = self.mid(self.pool(b))
        b = self.c2(torch.cat([self.u2(m), b], dim=1))
        a = self.c1(torch.cat([self.u1(b), a], dim=1))
        return self.head(a)


def unet_inputs(batch=2, size=32):
    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(4)),)
