"""Triton helpers shared by the forward and backward kernels: the sampling convention
(pixel coordinate ``x * W - 0.5``, align_corners=False, zero padding) written once."""
import triton
import triton.language as tl


@triton.jit
def pixel_corners(loc_x, loc_y, width, height):
    """Top-left corner (x0, y0) of the 2x2 neighbourhood of each normalised location, the
    fractional offsets (dx, dy) past it, and whether each of the two columns and rows lies
    inside the map (outside corners read and receive zero)."""
    x_im = loc_x * width - 0.5                      # normalised -> pixel coordinate
    y_im = loc_y * height - 0.5
    x0f = tl.floor(x_im)
    y0f = tl.floor(y_im)
    dx = x_im - x0f                                 # distance past the left column
    dy = y_im - y0f                                 # distance past the top row
    # Clamp before the int cast so a location far outside cannot overflow int32.
    x0 = tl.minimum(tl.maximum(x0f, -2.0), width + 1.0).to(tl.int32)
    y0 = tl.minimum(tl.maximum(y0f, -2.0), height + 1.0).to(tl.int32)
    in_x0 = (x0 >= 0) & (x0 < width)
    in_x1 = (x0 + 1 >= 0) & (x0 + 1 < width)
    in_y0 = (y0 >= 0) & (y0 < height)
    in_y1 = (y0 + 1 >= 0) & (y0 + 1 < height)
    return x0, y0, dx, dy, in_x0, in_x1, in_y0, in_y1


@triton.jit
def corner_tile(start, row, col, width, inside, mask_q, offs_d, mask_d, row_stride):
    """Element offsets (BLOCK_Q, BLOCK_D) of one corner's value rows, in int64, and the mask
    of the elements that exist (query in range, corner inside the map, channel < D)."""
    s = start + (row * width + col).to(tl.int64)    # row of the corner inside S
    offsets = (s * row_stride)[:, None] + offs_d[None, :]
    mask = (mask_q & inside)[:, None] & mask_d[None, :]
    return offsets, mask


@triton.jit
def corner_tile_3d(start, row, col, width, inside, mask_qs, offs_d, mask_d, row_stride):
    """As ``corner_tile`` for a (BLOCK_Q, SAMPLES) grid of samples: element offsets
    (BLOCK_Q, SAMPLES, BLOCK_D) in int64, and their mask."""
    s = start + (row * width + col).to(tl.int64)
    offsets = (s * row_stride)[:, :, None] + offs_d[None, None, :]
    mask = (mask_qs & inside)[:, :, None] & mask_d[None, None, :]
    return offsets, mask
