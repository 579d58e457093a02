package aws

// onDemandPrices are EC2 on-demand list prices in USD per hour for Linux in
// us-east-1: the fallback when the Price List API (pricelist.go) is denied,
// unreachable or has no price for a type. Source: the public "Amazon EC2
// On-Demand Pricing" page (aws.amazon.com/ec2/pricing/on-demand/), as read
// on 2024-06-01 (BundledPricesAsOf). Prices in other regions are usually
// 0–25 % higher and AWS changes them over time (P5 prices were cut in
// 2025), so offerings priced from here say "bundled table" and its date. A
// block's on_demand_prices overrides any entry. Spot prices are never
// bundled; they come from DescribeSpotPriceHistory.
var onDemandPrices = map[string]float64{
	"p3.2xlarge":  3.06,
	"p3.8xlarge":  12.24,
	"p3.16xlarge": 24.48,

	"p4d.24xlarge":  32.7726,
	"p4de.24xlarge": 40.9657,
	"p5.48xlarge":   98.32,

	"g5.xlarge":   1.006,
	"g5.2xlarge":  1.212,
	"g5.4xlarge":  1.624,
	"g5.8xlarge":  2.448,
	"g5.12xlarge": 5.672,
	"g5.16xlarge": 4.096,
	"g5.24xlarge": 8.144,
	"g5.48xlarge": 16.288,

	"g4dn.xlarge":   0.526,
	"g4dn.2xlarge":  0.752,
	"g4dn.4xlarge":  1.204,
	"g4dn.8xlarge":  2.176,
	"g4dn.12xlarge": 3.912,
	"g4dn.16xlarge": 4.352,
	"g4dn.metal":    7.824,

	"g6.xlarge":   0.8048,
	"g6.2xlarge":  0.9776,
	"g6.4xlarge":  1.3232,
	"g6.8xlarge":  2.0144,
	"g6.12xlarge": 4.6016,
	"g6.16xlarge": 3.3968,
	"g6.24xlarge": 6.6752,
	"g6.48xlarge": 13.3504,
}
