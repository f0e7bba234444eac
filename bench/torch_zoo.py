"""More transformers architectures for ``bench/torch_backend.py --models zoo``: small random
configs of families no luminal pass was written for (vision transformers, CNNs with depthwise
and grouped convolutions, encoder-decoder encoders, windowed attention), to judge the
compiler on graphs it was not tuned on. Image models take 64x64 pictures (the shape's batch
is used, its sequence length ignored); text models take the shape's batch and length. The
diffusers models (``vae``, ``unet``: group norms, 2x nearest upsampling, cross-attention;
32x32 inputs) need ``diffusers`` (``pip install ".[bench]"``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Make = Callable[[], tuple[nn.Module, Callable[[int, int], dict[str, Any]]]]


def _image(b: int, s: int) -> dict[str, Any]:
    return dict(pixel_values=torch.randn(b, 3, 64, 64))


def _ids(b: int, s: int) -> dict[str, Any]:
    return dict(input_ids=torch.randint(0, 1000, (b, s)))


def zoo() -> dict[str, Make]:
    import transformers as tf

    sdpa = dict(attn_implementation="sdpa")

    def vit():
        cfg = tf.ViTConfig(image_size=64, patch_size=8, hidden_size=192, intermediate_size=768,
                           num_hidden_layers=4, num_attention_heads=3, **sdpa)  # fmt: skip
        return tf.ViTModel(cfg).eval(), _image

    def resnet():
        cfg = tf.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256],
                              depths=[1, 1, 1, 1], layer_type="basic")  # fmt: skip
        return tf.ResNetModel(cfg).eval(), _image

    def convnext():
        cfg = tf.ConvNextConfig(hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1],
                                image_size=64)  # fmt: skip
        return tf.ConvNextModel(cfg).eval(), _image

    def mobilenetv2():
        return tf.MobileNetV2Model(tf.MobileNetV2Config(image_size=64)).eval(), _image

    def swin():
        cfg = tf.SwinConfig(image_size=64, patch_size=4, embed_dim=32, depths=[1, 1],
                            num_heads=[2, 4], window_size=4)  # fmt: skip
        return tf.SwinModel(cfg).eval(), _image

    def clip():
        cfg = tf.CLIPVisionConfig(image_size=64, patch_size=8, hidden_size=128,
                                  intermediate_size=512, num_hidden_layers=2,
                                  num_attention_heads=4, **sdpa)  # fmt: skip
        return tf.CLIPVisionModel(cfg).eval(), _image

    def t5():
        cfg = tf.T5Config(d_model=128, d_ff=512, num_layers=2, num_heads=4, d_kv=32,
                          vocab_size=1000)  # fmt: skip
        return tf.T5EncoderModel(cfg).eval(), _ids

    def distilbert():
        cfg = tf.DistilBertConfig(dim=256, hidden_dim=1024, n_layers=2, n_heads=4,
                                  vocab_size=1000, **sdpa)  # fmt: skip
        return tf.DistilBertModel(cfg).eval(), _ids

    def whisper():
        cfg = tf.WhisperConfig(d_model=128, encoder_layers=2, encoder_attention_heads=4,
                               decoder_layers=1, decoder_attention_heads=4, encoder_ffn_dim=512,
                               decoder_ffn_dim=512, num_mel_bins=40, max_source_positions=100,
                               vocab_size=100, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                               decoder_start_token_id=0, **sdpa)  # fmt: skip
        enc = tf.WhisperForConditionalGeneration(cfg).get_encoder().eval()
        return enc, lambda b, s: dict(input_features=torch.randn(b, 40, 200))

    def deberta():  # disentangled relative-position attention
        cfg = tf.DebertaV2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=512, vocab_size=1000)  # fmt: skip
        return tf.DebertaV2Model(cfg).eval(), _ids

    def mamba():  # a selective state-space scan (transformers' reference PyTorch path)
        cfg = tf.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=1000, state_size=8)
        return tf.MambaModel(cfg).eval(), _ids

    def wav2vec2():  # strided 1-d convolutions over raw audio, grouped conv positions
        cfg = tf.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=128, conv_dim=(32, 32, 32),
                                conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                                num_conv_pos_embeddings=16,
                                num_conv_pos_embedding_groups=4)  # fmt: skip
        return tf.Wav2Vec2Model(cfg).eval(), lambda b, s: dict(input_values=torch.randn(b, 1600))

    def segformer():  # overlapping patch merges, reduced-key attention, depthwise conv MLP
        cfg = tf.SegformerConfig(hidden_sizes=[16, 32, 64, 128], num_attention_heads=[1, 2, 4, 4],
                                 depths=[1, 1, 1, 1], decoder_hidden_size=64)  # fmt: skip
        return tf.SegformerModel(cfg).eval(), _image

    def mixtral():  # a mixture of experts: top-2 routing by a sort of expert ids
        cfg = tf.MixtralConfig(vocab_size=1000, hidden_size=128, intermediate_size=256,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               num_local_experts=4, num_experts_per_tok=2, **sdpa)  # fmt: skip
        model = tf.MixtralForCausalLM(cfg).eval()
        return model, lambda b, s: dict(_ids(b, s), use_cache=False)

    def fnet():  # token mixing by a 2-d FFT over the sequence and hidden axes
        cfg = tf.FNetConfig(hidden_size=128, num_hidden_layers=2, intermediate_size=512,
                            vocab_size=1000, max_position_embeddings=128)  # fmt: skip
        return tf.FNetModel(cfg).eval(), _ids

    def vae():  # a VAE's encoder and decoder: group norms, 2x nearest upsampling
        from diffusers import AutoencoderKL

        m = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(32, 64),
                          down_block_types=("DownEncoderBlock2D",) * 2,
                          up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4,
                          norm_num_groups=8, sample_size=32)  # fmt: skip
        return m.eval(), lambda b, s: dict(sample=torch.randn(b, 3, 32, 32))

    def unet():  # a denoising U-Net: time embedding, cross-attention to s text states
        from diffusers import UNet2DConditionModel

        m = UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4,
                                 layers_per_block=1, block_out_channels=(32, 64),
                                 down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                                 cross_attention_dim=32, attention_head_dim=8,
                                 norm_num_groups=8)  # fmt: skip
        return m.eval(), lambda b, s: dict(sample=torch.randn(b, 4, 16, 16),
                                           timestep=torch.tensor([10] * b),
                                           encoder_hidden_states=torch.randn(b, s, 32))  # fmt: skip

    return {"vit": vit, "resnet": resnet, "convnext": convnext, "mobilenetv2": mobilenetv2,
            "swin": swin, "clip": clip, "t5": t5, "distilbert": distilbert,
            "whisper": whisper, "deberta": deberta, "mamba": mamba, "wav2vec2": wav2vec2,
            "segformer": segformer, "mixtral": mixtral, "fnet": fnet, "vae": vae,
            "unet": unet}  # fmt: skip
