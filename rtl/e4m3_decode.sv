// e4m3_decode: an E4M3 code to FP32 bits, exact (scale.hpp e4m3_decode). Subnormal codes (exponent
// field 0) are m * 2^-9; normal ones (8 + m) * 2^(e - 10). 0x7F/0xFF (NaN) are never produced here.
module e4m3_decode (
  input  logic [7:0]  code_i,
  output logic [31:0] y_o
);
  logic [3:0] e;
  logic [2:0] m;
  always_comb begin
    e = code_i[6:3];
    m = code_i[2:0];
    if (e != '0) y_o = {code_i[7], 8'(e) + 8'd120, m, 20'd0};
    else if (m[2]) y_o = {code_i[7], 8'd120, m[1:0], 21'd0};   // 1.xx * 2^-7
    else if (m[1]) y_o = {code_i[7], 8'd119, m[0], 22'd0};     // 1.x * 2^-8
    else if (m[0]) y_o = {code_i[7], 8'd118, 23'd0};           // 2^-9
    else y_o = {code_i[7], 31'd0};
  end
endmodule
