// RMS norm of 128 rows x 512 fp16, split over 32 cores by rows: core t owns rows [4 t, 4 t + 4)
// and normalises them two rows per tile. y = x * rsqrt(mean(x * x) + eps) * w, the sum of squares
// accumulated in fp32 (the reduction's init and output are f32), as torch's rms_norm does.
#mat = affine_set<(d0, d1) : (d0 >= 0, -d0 + 127 >= 0, d1 >= 0, -d1 + 511 >= 0)>
#two_rows = affine_set<(d0, d1) : (d0 >= 0, -d0 + 1 >= 0, d1 >= 0, -d1 + 511 >= 0)>
#vec = affine_set<(d0) : (d0 >= 0, -d0 + 511 >= 0)>
#id1 = affine_map<(d0) -> (d0)>
#id2 = affine_map<(d0, d1) -> (d0, d1)>
#rows_of_core = affine_map<(t) -> (t * 4)>

module {
  func.func @rms_norm(%x_ptr: index, %w_ptr: index, %out_ptr: index) attributes {grid = [32]} {
    %c0 = arith.constant 0 : index
    %c2 = arith.constant 2 : index
    %c4 = arith.constant 4 : index
    %t = ktdp.get_compute_tile_id : index
    %first = affine.apply #rows_of_core(%t)
    %last = arith.addi %first, %c4 : index
    %x_view = ktdp.construct_memory_view %x_ptr, sizes: [128, 512], strides: [512, 1] {
      coordinate_set = #mat, memory_space = #ktdp.memory_space<global>
    } : memref<128x512xf16>
    %w_view = ktdp.construct_memory_view %w_ptr, sizes: [512], strides: [1] {
      coordinate_set = #vec, memory_space = #ktdp.memory_space<global>
    } : memref<512xf16>
    %out_view = ktdp.construct_memory_view %out_ptr, sizes: [128, 512], strides: [512, 1] {
      coordinate_set = #mat, memory_space = #ktdp.memory_space<global>
    } : memref<128x512xf16>
    // the weight is loaded once per core and stays in LX for both tiles
    %w_acc = ktdp.construct_access_tile %w_view[%c0] {access_tile_set = #vec, access_tile_order = #id1}
        : memref<512xf16> -> !ktdp.access_tile<512xindex>
    %w = ktdp.load %w_acc : !ktdp.access_tile<512xindex> -> tensor<512xf16>
    %w_init = tensor.empty() : tensor<2x512xf16>
    %w2 = linalg.broadcast ins(%w : tensor<512xf16>) outs(%w_init : tensor<2x512xf16>) dimensions = [0]
    scf.for %r = %first to %last step %c2 {
      %acc = ktdp.construct_access_tile %x_view[%r, %c0] {access_tile_set = #two_rows, access_tile_order = #id2}
          : memref<128x512xf16> -> !ktdp.access_tile<2x512xindex>
      %x = ktdp.load %acc : !ktdp.access_tile<2x512xindex> -> tensor<2x512xf16>
      %xf = arith.extf %x : tensor<2x512xf16> to tensor<2x512xf32>
      %sq = arith.mulf %xf, %xf : tensor<2x512xf32>
      %zero = arith.constant 0.0 : f32
      %ss0 = tensor.splat %zero : tensor<2xf32>
      %ss = linalg.reduce { arith.addf } ins(%sq : tensor<2x512xf32>) outs(%ss0 : tensor<2xf32>) dimensions = [1]
      %n = arith.constant 512.0 : f32
      %nv = tensor.splat %n : tensor<2xf32>
      %mean = arith.divf %ss, %nv : tensor<2xf32>
      %eps = arith.constant 1.0e-6 : f32
      %epsv = tensor.splat %eps : tensor<2xf32>
      %var = arith.addf %mean, %epsv : tensor<2xf32>
      %inv = math.rsqrt %var : tensor<2xf32>
      %inv_init = tensor.empty() : tensor<2x512xf32>
      %inv2 = linalg.broadcast ins(%inv : tensor<2xf32>) outs(%inv_init : tensor<2x512xf32>) dimensions = [1]
      %normed = arith.mulf %xf, %inv2 : tensor<2x512xf32>
      %h = arith.truncf %normed : tensor<2x512xf32> to tensor<2x512xf16>
      %y = arith.mulf %h, %w2 : tensor<2x512xf16>
      %o = ktdp.construct_access_tile %out_view[%r, %c0] {access_tile_set = #two_rows, access_tile_order = #id2}
          : memref<128x512xf16> -> !ktdp.access_tile<2x512xindex>
      ktdp.store %y, %o : tensor<2x512xf16>, !ktdp.access_tile<2x512xindex>
      scf.yield
    }
    return
  }
}
