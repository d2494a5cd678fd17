// Row softmax of a 64 x 256 fp16 matrix on 32 cores: core t takes rows t and t + 32
// (a strided split: scf.for from the tile id in steps of the grid size).
// Per row: max, subtract, exp, sum, divide - the five LoopIR nodes of a compiled softmax.
#mat = affine_set<(d0, d1) : (d0 >= 0, -d0 + 63 >= 0, d1 >= 0, -d1 + 255 >= 0)>
#row = affine_set<(d0, d1) : (d0 == 0, d1 >= 0, -d1 + 255 >= 0)>
#id2 = affine_map<(d0, d1) -> (d0, d1)>

module {
  func.func @row_softmax(%in_ptr: index, %out_ptr: index) attributes {grid = [32, 1]} {
    %c0 = arith.constant 0 : index
    %c32 = arith.constant 32 : index
    %c64 = arith.constant 64 : index
    %t = ktdp.get_compute_tile_id : index
    %in_view = ktdp.construct_memory_view %in_ptr, sizes: [64, 256], strides: [256, 1] {
      coordinate_set = #mat, memory_space = #ktdp.memory_space<global>
    } : memref<64x256xf16>
    %out_view = ktdp.construct_memory_view %out_ptr, sizes: [64, 256], strides: [256, 1] {
      coordinate_set = #mat, memory_space = #ktdp.memory_space<global>
    } : memref<64x256xf16>
    scf.for %r = %t to %c64 step %c32 {
      %acc = ktdp.construct_access_tile %in_view[%r, %c0] {access_tile_set = #row, access_tile_order = #id2}
          : memref<64x256xf16> -> !ktdp.access_tile<1x256xindex>
      %x = ktdp.load %acc : !ktdp.access_tile<1x256xindex> -> tensor<1x256xf16>
      %ninf = arith.constant 0xFC00 : f16
      %max0 = tensor.splat %ninf : tensor<1xf16>
      %max = linalg.reduce { arith.maximumf } ins(%x : tensor<1x256xf16>) outs(%max0 : tensor<1xf16>) dimensions = [1]
      %m = tensor.extract %max[%c0] : tensor<1xf16>
      %mrow = tensor.splat %m : tensor<1x256xf16>
      %shifted = arith.subf %x, %mrow : tensor<1x256xf16>
      %e = math.exp %shifted : tensor<1x256xf16>
      %zero = arith.constant 0.0 : f16
      %sum0 = tensor.splat %zero : tensor<1xf16>
      %sum = linalg.reduce { arith.addf } ins(%e : tensor<1x256xf16>) outs(%sum0 : tensor<1xf16>) dimensions = [1]
      %s = tensor.extract %sum[%c0] : tensor<1xf16>
      %srow = tensor.splat %s : tensor<1x256xf16>
      %y = arith.divf %e, %srow : tensor<1x256xf16>
      %o = ktdp.construct_access_tile %out_view[%r, %c0] {access_tile_set = #row, access_tile_order = #id2}
          : memref<64x256xf16> -> !ktdp.access_tile<1x256xindex>
      ktdp.store %y, %o : tensor<1x256xf16>, !ktdp.access_tile<1x256xindex>
      scf.yield
    }
    return
  }
}
