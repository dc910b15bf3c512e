use kernel_ir::{Array, DType, TensorType};
fn main() {
    let plugin: &'static runtime::pjrt::Plugin = Box::leak(Box::new(runtime::pjrt::Plugin::load(std::path::Path::new(env!("TESSERA_DEFAULT_PJRT_PLUGIN"))).unwrap()));
    println!("api {:?}", plugin.api_version());
    let client = plugin.client().unwrap();
    let t = std::time::Instant::now();
    let exe = client.compile(r#"module {
  func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = "stablehlo.add"(%a, %b) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"#).unwrap();
    println!("compiled in {:?}", t.elapsed());
    let a = Array::from_f32(DType::F32, [4], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let out = client.execute(&exe, &[a.clone(), a], &[TensorType::new(DType::F32, [4])]).unwrap();
    println!("{:?}", out[0].as_f32());
    let bad = client.compile("module { func.func @main() { frob } }");
    println!("bad: {:?}", bad.err());
}
