// Vector add on 32 cores: out = x + y for 8192 fp16 elements.
// Work division through the tile id: core t owns elements [256 t, 256 t + 256) and walks them
// in tiles of 128 (two sticks), so each core runs two load-load-add-store rounds.
#vec = affine_set<(d0) : (d0 >= 0, -d0 + 8191 >= 0)>
#tile = affine_set<(d0) : (d0 >= 0, -d0 + 127 >= 0)>
#id1 = affine_map<(d0) -> (d0)>

module {
  func.func @vector_add(%x_ptr: index, %y_ptr: index, %out_ptr: index) attributes {grid = [32]} {
    %c128 = arith.constant 128 : index
    %c256 = arith.constant 256 : index
    %t = ktdp.get_compute_tile_id : index
    %start = arith.muli %t, %c256 : index
    %end = arith.addi %start, %c256 : index
    %x_view = ktdp.construct_memory_view %x_ptr, sizes: [8192], strides: [1] {
      coordinate_set = #vec, memory_space = #ktdp.memory_space<global>
    } : memref<8192xf16>
    %y_view = ktdp.construct_memory_view %y_ptr, sizes: [8192], strides: [1] {
      coordinate_set = #vec, memory_space = #ktdp.memory_space<global>
    } : memref<8192xf16>
    %out_view = ktdp.construct_memory_view %out_ptr, sizes: [8192], strides: [1] {
      coordinate_set = #vec, memory_space = #ktdp.memory_space<global>
    } : memref<8192xf16>
    scf.for %i = %start to %end step %c128 {
      %x_acc = ktdp.construct_access_tile %x_view[%i] {access_tile_set = #tile, access_tile_order = #id1}
          : memref<8192xf16> -> !ktdp.access_tile<128xindex>
      %y_acc = ktdp.construct_access_tile %y_view[%i] {access_tile_set = #tile, access_tile_order = #id1}
          : memref<8192xf16> -> !ktdp.access_tile<128xindex>
      %x = ktdp.load %x_acc : !ktdp.access_tile<128xindex> -> tensor<128xf16>
      %y = ktdp.load %y_acc : !ktdp.access_tile<128xindex> -> tensor<128xf16>
      %sum = arith.addf %x, %y : tensor<128xf16>
      %o_acc = ktdp.construct_access_tile %out_view[%i] {access_tile_set = #tile, access_tile_order = #id1}
          : memref<8192xf16> -> !ktdp.access_tile<128xindex>
      ktdp.store %sum, %o_acc : tensor<128xf16>, !ktdp.access_tile<128xindex>
      scf.yield
    }
    return
  }
}
