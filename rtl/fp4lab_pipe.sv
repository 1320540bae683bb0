// fp4lab_pipe: DEPTH pipeline registers with a valid/ready handshake. All stages move together when the
// output is taken or empty (one enable, no combinational chain between stages); DEPTH = 0 is a wire.
// Units put their combinational datapath in front of it and leave register placement to retiming.
module fp4lab_pipe #(
  parameter int unsigned WIDTH = 1,
  parameter int unsigned DEPTH = 1
) (
  input  logic             clk_i,
  input  logic             rst_ni,
  input  logic             in_valid_i,
  output logic             in_ready_o,
  input  logic [WIDTH-1:0] in_data_i,
  output logic             out_valid_o,
  input  logic             out_ready_i,
  output logic [WIDTH-1:0] out_data_o
);
  if (DEPTH == 0) begin : gen_wire
    assign out_valid_o = in_valid_i;
    assign in_ready_o  = out_ready_i;
    assign out_data_o  = in_data_i;
    /* verilator lint_off UNUSEDSIGNAL */
    logic unused_clk;
    assign unused_clk = clk_i ^ rst_ni;
    /* verilator lint_on UNUSEDSIGNAL */
  end else begin : gen_regs
    localparam int unsigned DW = DEPTH * WIDTH;
    logic [DEPTH-1:0] valid_q;
    logic [DW-1:0]    data_q;   // stage s in bits [WIDTH*s +: WIDTH]; stage DEPTH-1 is the output
    logic             en;

    assign en = out_ready_i | ~valid_q[DEPTH-1];
    assign in_ready_o = en;
    assign out_valid_o = valid_q[DEPTH-1];
    assign out_data_o = data_q[WIDTH*(DEPTH-1) +: WIDTH];

    always_ff @(posedge clk_i or negedge rst_ni) begin
      if (!rst_ni) valid_q <= '0;
      else if (en) valid_q <= DEPTH'({valid_q, in_valid_i});
    end
    // Data needs no reset: it is only looked at when valid.
    always_ff @(posedge clk_i) begin
      if (en) data_q <= DW'({data_q, in_data_i});
    end
  end
endmodule
