// C[128, 256] = A[128, 256] @ B[256, 256], fp16, tiled in 2-D over a [8, 4] grid of cores:
// tile id (pm, pn) owns C rows [16 pm, 16 pm + 16) and columns [64 pn, 64 pn + 64) and walks K in
// steps of 64, accumulating in fp32 (scf.for with iter_args), then rounds to fp16 and stores.
#a_set = affine_set<(d0, d1) : (d0 >= 0, -d0 + 127 >= 0, d1 >= 0, -d1 + 255 >= 0)>
#b_set = affine_set<(d0, d1) : (d0 >= 0, -d0 + 255 >= 0, d1 >= 0, -d1 + 255 >= 0)>
#a_tile = affine_set<(d0, d1) : (d0 >= 0, -d0 + 15 >= 0, d1 >= 0, -d1 + 63 >= 0)>
#b_tile = affine_set<(d0, d1) : (d0 >= 0, -d0 + 63 >= 0, d1 >= 0, -d1 + 63 >= 0)>
#c_tile = affine_set<(d0, d1) : (d0 >= 0, -d0 + 15 >= 0, d1 >= 0, -d1 + 63 >= 0)>
#id2 = affine_map<(d0, d1) -> (d0, d1)>

module {
  func.func @matmul_2d(%a_ptr: index, %b_ptr: index, %c_ptr: index) attributes {grid = [8, 4]} {
    %pm, %pn = ktdp.get_compute_tile_id : index, index
    %c0 = arith.constant 0 : index
    %c16 = arith.constant 16 : index
    %c64 = arith.constant 64 : index
    %c256 = arith.constant 256 : index
    %row = arith.muli %pm, %c16 : index
    %col = arith.muli %pn, %c64 : index
    %a_view = ktdp.construct_memory_view %a_ptr, sizes: [128, 256], strides: [256, 1] {
      coordinate_set = #a_set, memory_space = #ktdp.memory_space<global>
    } : memref<128x256xf16>
    %b_view = ktdp.construct_memory_view %b_ptr, sizes: [256, 256], strides: [256, 1] {
      coordinate_set = #b_set, memory_space = #ktdp.memory_space<global>
    } : memref<256x256xf16>
    %c_view = ktdp.construct_memory_view %c_ptr, sizes: [128, 256], strides: [256, 1] {
      coordinate_set = #a_set, memory_space = #ktdp.memory_space<global>
    } : memref<128x256xf16>
    %zero = arith.constant dense<0.0> : tensor<16x64xf32>
    %acc = scf.for %k = %c0 to %c256 step %c64 iter_args(%sum = %zero) -> (tensor<16x64xf32>) {
      %a_acc = ktdp.construct_access_tile %a_view[%row, %k] {access_tile_set = #a_tile, access_tile_order = #id2}
          : memref<128x256xf16> -> !ktdp.access_tile<16x64xindex>
      %b_acc = ktdp.construct_access_tile %b_view[%k, %col] {access_tile_set = #b_tile, access_tile_order = #id2}
          : memref<256x256xf16> -> !ktdp.access_tile<64x64xindex>
      %a = ktdp.load %a_acc : !ktdp.access_tile<16x64xindex> -> tensor<16x64xf16>
      %b = ktdp.load %b_acc : !ktdp.access_tile<64x64xindex> -> tensor<64x64xf16>
      %next = linalg.matmul ins(%a, %b : tensor<16x64xf16>, tensor<64x64xf16>) outs(%sum : tensor<16x64xf32>)
          -> tensor<16x64xf32>
      scf.yield %next : tensor<16x64xf32>
    }
    %c = arith.truncf %acc : tensor<16x64xf32> to tensor<16x64xf16>
    %c_acc = ktdp.construct_access_tile %c_view[%row, %col] {access_tile_set = #c_tile, access_tile_order = #id2}
        : memref<128x256xf16> -> !ktdp.access_tile<16x64xindex>
    ktdp.store %c, %c_acc : tensor<16x64xf16>, !ktdp.access_tile<16x64xindex>
    return
  }
}
