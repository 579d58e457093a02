package fakeec2

// InstanceType is one EC2 instance type the fake knows, with the fields
// DescribeInstanceTypes reports.
type InstanceType struct {
	Name            string
	VCPUs           int
	MemoryMiB       int
	GPUs            int
	GPUName         string // e.g. "A100"
	GPUManufacturer string // e.g. "NVIDIA"
	GPUMemoryMiB    int    // per GPU
	// Arch is EC2's processor architecture ("x86_64", "arm64"); "" is x86_64.
	Arch string
	// EFAInterfaces is EfaInfo.MaximumEfaInterfaces (0: no EFA);
	// NetworkCards is NetworkInfo.MaximumNetworkCards (0 means 1), each
	// card CardGbps fast.
	EFAInterfaces int
	NetworkCards  int
	CardGbps      float64
	// SpotPrice is the seed spot $/h in the region's first zone; later
	// zones are a little dearer so "cheapest zone" is well defined.
	SpotPrice float64
}

// DefaultInstanceTypes is the fake's catalogue: the GPU types fleetd is
// usually pointed at (one of them Graviton, arm64) plus one CPU type. Shapes follow the EC2 documentation
// (EFA: p4d 4 cards × 100 Gbps, p5 32 × 100 Gbps, g5.12xlarge 1 × 40 Gbps);
// spot prices are plausible, not real.
var DefaultInstanceTypes = []InstanceType{
	{Name: "p3.2xlarge", VCPUs: 8, MemoryMiB: 62464, GPUs: 1, GPUName: "V100", GPUManufacturer: "NVIDIA", GPUMemoryMiB: 16384, SpotPrice: 0.92},
	{Name: "p3.8xlarge", VCPUs: 32, MemoryMiB: 249856, GPUs: 4, GPUName: "V100", GPUManufacturer: "NVIDIA", GPUMemoryMiB: 16384, SpotPrice: 3.67},
	{Name: "p3.16xlarge", VCPUs: 64, MemoryMiB: 499712, GPUs: 8, GPUName: "V100", GPUManufacturer: "NVIDIA", GPUMemoryMiB: 16384, SpotPrice: 7.34},
	{Name: "p4d.24xlarge", VCPUs: 96, MemoryMiB: 1179648, GPUs: 8, GPUName: "A100", GPUManufacturer: "NVIDIA", GPUMemoryMiB: 40960, EFAInterfaces: 4, NetworkCards: 4, CardGbps: 100, SpotPrice: 9.83},
	{Name: "p5.48xlarge", VCPUs: 192, MemoryMiB: 2097152, GPUs: 8, GPUName: "H100", GPUManufacturer: "NVIDIA", GPUMemoryMiB: 81920, EFAInterfaces: 32, NetworkCards: 32, CardGbps: 100, SpotPrice: 29.5},
	{Name: "g5.xlarge", VCPUs: 4, MemoryMiB: 16384, GPUs: 1, GPUName: "A10G", GPUManufacturer: "NVIDIA", GPUMemoryMiB: 24576, SpotPrice: 0.43},
	{Name: "g5.12xlarge", VCPUs: 48, MemoryMiB: 196608, GPUs: 4, GPUName: "A10G", GPUManufacturer: "NVIDIA", GPUMemoryMiB: 24576, EFAInterfaces: 1, NetworkCards: 1, CardGbps: 40, SpotPrice: 2.1},
	{Name: "g4dn.xlarge", VCPUs: 4, MemoryMiB: 16384, GPUs: 1, GPUName: "T4", GPUManufacturer: "NVIDIA", GPUMemoryMiB: 16384, SpotPrice: 0.21},
	{Name: "g6.xlarge", VCPUs: 4, MemoryMiB: 16384, GPUs: 1, GPUName: "L4", GPUManufacturer: "NVIDIA", GPUMemoryMiB: 22888, SpotPrice: 0.35},
	{Name: "g5g.xlarge", VCPUs: 4, MemoryMiB: 8192, GPUs: 1, GPUName: "T4g", GPUManufacturer: "NVIDIA", GPUMemoryMiB: 16384, Arch: "arm64", SpotPrice: 0.17},
	{Name: "m5.large", VCPUs: 2, MemoryMiB: 8192, SpotPrice: 0.04},
}
