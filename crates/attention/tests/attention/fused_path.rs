//! `SdpaPath::Fused` (`UNET_ATTENTION_SDPA=fused`): parsed like the other paths, and where the
//! fused CUDA kernel does not apply (here: the CPU) exactly what `Auto` gives.

use candle_core::{DType, Device, Tensor};
use unet_attention::sdpa::{eager_attention_with, sdpa_with, Scale, SdpaPath};

#[test]
fn fused_is_a_path_name() {
    let p: SdpaPath = " Fused ".parse().unwrap();
    assert_eq!(p, SdpaPath::Fused);
    assert_eq!(p.to_string(), "fused");
    let err = "fusd".parse::<SdpaPath>().unwrap_err();
    assert!(err.contains("fused"), "{err}");
}

#[test]
fn fused_falls_back_to_auto_off_cuda() {
    let dev = Device::Cpu;
    let r = |s: &[usize]| Tensor::randn(0f32, 1., s, &dev).unwrap();
    let (q, k, v) = (r(&[2, 3, 9, 40]), r(&[2, 3, 77, 40]), r(&[2, 3, 77, 40]));
    let mask = r(&[2, 1, 9, 77]);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let c = |t: &Tensor| t.to_dtype(dtype).unwrap();
        let (q, k, v, m) = (c(&q), c(&k), c(&v), c(&mask));
        let vals = |t: Tensor| {
            t.to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        for m in [None, Some(&m)] {
            let want = vals(sdpa_with(SdpaPath::Auto, &q, &k, &v, m, 0.2).unwrap());
            let got = vals(sdpa_with(SdpaPath::Fused, &q, &k, &v, m, 0.2).unwrap());
            assert_eq!(got, want, "{dtype:?} masked={}", m.is_some());
            let want = vals(eager_attention_with(SdpaPath::Auto, &q, &k, &v, m, Scale::Div(5.0)).unwrap());
            let got = vals(eager_attention_with(SdpaPath::Fused, &q, &k, &v, m, Scale::Div(5.0)).unwrap());
            assert_eq!(got, want, "eager {dtype:?} masked={}", m.is_some());
        }
    }
}
