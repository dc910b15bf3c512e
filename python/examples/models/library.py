"""Models of Hugging Face Transformers, timm and diffusers, built from small configs with random
weights (nothing is downloaded): the graph-mode test bed (``size="test"``) and
benchmark (``size="bench"``) beside the zoo."""

import torch

# name -> (hidden size, layers, tokens per sequence) by size
SIZES = {"test": (64, 2, 16), "bench": (256, 4, 128)}
VOCAB = 100
DECODERS = ("gpt2", "llama", "qwen2", "mistral", "gemma2")
VISION = ("vit", "convnext", "resnet18")


def _decoder_config(cls, hidden: int, layers: int, **extra):
    return cls(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        **extra,
    )


def causal_lm(name: str, size: str = "test"):
    """A causal LM of one of the families Transformers users run (dropout off); Mistral
    with a sliding window shorter than the sequence, Gemma 2 soft-capped."""
    import transformers

    hidden, layers, seq = SIZES[size]
    torch.manual_seed(0)
    if name == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=hidden,
            n_layer=layers,
            n_head=4,
            vocab_size=VOCAB,
            n_positions=512,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        return transformers.GPT2LMHeadModel(cfg)
    if name == "llama":
        return transformers.LlamaForCausalLM(_decoder_config(transformers.LlamaConfig, hidden, layers))
    if name == "qwen2":
        return transformers.Qwen2ForCausalLM(_decoder_config(transformers.Qwen2Config, hidden, layers))
    if name == "mistral":
        return transformers.MistralForCausalLM(
            _decoder_config(transformers.MistralConfig, hidden, layers, sliding_window=seq // 2)
        )
    if name == "gemma2":
        return transformers.Gemma2ForCausalLM(
            _decoder_config(
                transformers.Gemma2Config,
                hidden,
                layers,
                head_dim=hidden // 4,
                sliding_window=seq // 2,
                attn_logit_softcapping=50.0,
                final_logit_softcapping=30.0,
            )
        )
    raise ValueError(f"unknown causal LM {name!r}; expected one of {DECODERS}")


def bert(size: str = "test"):
    """A BERT encoder (dropout off)."""
    import transformers

    hidden, layers, _ = SIZES[size]
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        vocab_size=VOCAB,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertModel(cfg)


def vision(name: str, size: str = "test"):
    """A timm image model and its input batch (32x32 images to test, 128x128 to bench)."""
    import timm

    _, layers, _ = SIZES[size]
    pixels = 32 if size == "test" else 128
    kwargs = {
        "vit": ("vit_tiny_patch16_224", {"img_size": pixels, "patch_size": 8, "depth": layers}),
        "convnext": ("convnext_atto", {"depths": (1, 1, 1, 1)} if size == "test" else {}),
        "resnet18": ("resnet18", {}),
    }
    if name not in kwargs:
        raise ValueError(f"unknown vision model {name!r}; expected one of {VISION}")
    arch, extra = kwargs[name]
    torch.manual_seed(0)
    model = timm.create_model(arch, pretrained=False, num_classes=10, **extra)
    return model, torch.randn(2 if size == "test" else 8, 3, pixels, pixels)


def diffusion_unet(size: str = "test"):
    """A diffusers text-conditioned UNet (cross-attention in both resolutions' attention
    blocks) and its inputs: latents, timesteps, text states."""
    import diffusers

    torch.manual_seed(0)
    pixels, width = (16, 32) if size == "test" else (32, 64)
    unet = diffusers.UNet2DConditionModel(
        sample_size=pixels,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(width, 2 * width),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    batch = 2
    generator = torch.Generator().manual_seed(1)
    return unet, (
        torch.randn(batch, 4, pixels, pixels, generator=generator),
        torch.tensor([10, 20]),
        torch.randn(batch, 7, 32, generator=generator),
    )


def tokens(size: str = "test", batch: int = 2) -> torch.Tensor:
    """Token ids for a decoder or BERT of this size."""
    _, _, seq = SIZES[size]
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(1))
