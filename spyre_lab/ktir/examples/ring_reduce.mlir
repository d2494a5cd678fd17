// out[128] = sum over rows of X[32, 128], fp16 in, fp32 partials, on a [32] grid of cores.
// Tile id p loads row p and widens it to fp32. ktdp.inter_tile_produce offers that row as its partial to
// the one reduce group (every tile id i with 0 <= i <= 31); ktdp.inter_tile_reduce folds the group's
// partials on its consumer, core 0 alone, starting from the identity (zeros). The partials travel
// over the ring as a chain: core 31 -> 30 -> ... -> 0, each core adding its own row on the way.
// Core 0 then rounds to fp16 and stores; the other cores hold no result (scf.if keeps them out).
#row_set = affine_set<(d0, d1) : (d0 >= 0, -d0 + 31 >= 0, d1 >= 0, -d1 + 127 >= 0)>
#one_row = affine_set<(d0, d1) : (d0 >= 0, -d0 >= 0, d1 >= 0, -d1 + 127 >= 0)>
#out_set = affine_set<(d0) : (d0 >= 0, -d0 + 127 >= 0)>
#id1 = affine_map<(d0) -> (d0)>
#id2 = affine_map<(d0, d1) -> (d0, d1)>
#everyone = affine_set<(i)[g] : (i >= 0, -i + 31 >= 0, g == 0)>
#core0 = affine_set<(i)[g] : (i == 0, g == 0)>

module {
  func.func @ring_reduce(%x_ptr: index, %out_ptr: index) attributes {grid = [32]} {
    %p = ktdp.get_compute_tile_id : index
    %c0 = arith.constant 0 : index
    %x_view = ktdp.construct_memory_view %x_ptr, sizes: [32, 128], strides: [128, 1] {
      coordinate_set = #row_set, memory_space = #ktdp.memory_space<global>
    } : memref<32x128xf16>
    %x_acc = ktdp.construct_access_tile %x_view[%p, %c0] {access_tile_set = #one_row, access_tile_order = #id2}
        : memref<32x128xf16> -> !ktdp.access_tile<1x128xindex>
    %row = ktdp.load %x_acc : !ktdp.access_tile<1x128xindex> -> tensor<1x128xf16>
    %wide = arith.extf %row : tensor<1x128xf16> to tensor<1x128xf32>
    %partials = ktdp.inter_tile_produce producer_tiles_per_group = #everyone
        : tensor<1x128xf32> -> !ktdp.tile_future<tensor<1x128xf32>, groups = affine_set<(g) : (g == 0)>> {
      ^bb0(%group: index):
        ktdp.yield_partial %wide : tensor<1x128xf32>
    }
    %zero = arith.constant 0.0 : f32
    %empty = tensor.empty() : tensor<1x128xf32>
    %identity = linalg.fill ins(%zero : f32) outs(%empty : tensor<1x128xf32>) -> tensor<1x128xf32>
    %total = ktdp.inter_tile_reduce(%partials) consumer_tiles_per_group = #core0, identity(%identity : tensor<1x128xf32>)
        : !ktdp.tile_future<tensor<1x128xf32>, groups = affine_set<(g) : (g == 0)>> -> tensor<1x128xf32> {
      ^bb0(%lhs: tensor<1x128xf32>, %rhs: tensor<1x128xf32>):
        %sum = arith.addf %lhs, %rhs : tensor<1x128xf32>
        ktdp.yield_reduced %sum : tensor<1x128xf32>
    }
    %is_core0 = arith.cmpi eq, %p, %c0 : index
    scf.if %is_core0 {
      %narrow = arith.truncf %total : tensor<1x128xf32> to tensor<1x128xf16>
      %flat = tensor.collapse_shape %narrow [[0, 1]] : tensor<1x128xf16> into tensor<128xf16>
      %out_view = ktdp.construct_memory_view %out_ptr, sizes: [128], strides: [1] {
        coordinate_set = #out_set, memory_space = #ktdp.memory_space<global>
      } : memref<128xf16>
      %out_acc = ktdp.construct_access_tile %out_view[%c0] {access_tile_set = #out_set, access_tile_order = #id1}
          : memref<128xf16> -> !ktdp.access_tile<128xindex>
      ktdp.store %flat, %out_acc : tensor<128xf16>, !ktdp.access_tile<128xindex>
    }
    return
  }
}
