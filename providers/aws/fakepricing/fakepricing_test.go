package fakepricing_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/pricing"
	"github.com/aws/aws-sdk-go-v2/service/pricing/types"

	"github.com/fleetd/fleetd/providers/aws/fakepricing"
)

func client(t *testing.T, fake *fakepricing.Server) *pricing.Client {
	t.Helper()
	ts := httptest.NewServer(fake)
	t.Cleanup(ts.Close)
	return pricing.New(pricing.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(ts.URL), RetryMaxAttempts: 1,
		Credentials: credentials.NewStaticCredentialsProvider("AKIATEST", "secret", ""),
	})
}

func term(field, value string) types.Filter {
	return types.Filter{Type: types.FilterTypeTermMatch, Field: aws.String(field), Value: aws.String(value)}
}

// TestGetProducts goes through the real SDK client: filters select
// products case-insensitively, items parse as the service's documents and
// pages chain by NextToken.
func TestGetProducts(t *testing.T) {
	fake := fakepricing.New()
	fake.AddEC2("us-east-1", "g5.xlarge", "1.0060000000")
	fake.AddEC2("us-east-1", "g5.xlarge", "1.8", "operatingSystem", "Windows")
	fake.AddEC2("us-west-2", "g5.xlarge", "1.1")
	for _, it := range []string{"g6.xlarge", "g6.2xlarge", "g6.4xlarge"} {
		fake.AddEC2("us-east-1", it, "0.8")
	}
	c := client(t, fake)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	tests := []struct {
		name    string
		filters []types.Filter
		want    int
	}{
		{"one product", []types.Filter{term("instanceType", "g5.xlarge"), term("regionCode", "us-east-1"), term("operatingSystem", "linux")}, 1},
		{"both os", []types.Filter{term("instanceType", "g5.xlarge"), term("regionCode", "us-east-1")}, 2},
		{"by location", []types.Filter{term("location", "US West (Oregon)")}, 1},
		{"none", []types.Filter{term("instanceType", "p5.48xlarge")}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := c.GetProducts(ctx, &pricing.GetProductsInput{ServiceCode: aws.String("AmazonEC2"), Filters: tt.filters})
			if err != nil {
				t.Fatal(err)
			}
			if len(out.PriceList) != tt.want {
				t.Fatalf("%d items, want %d", len(out.PriceList), tt.want)
			}
			for _, doc := range out.PriceList {
				var item struct {
					Terms struct {
						OnDemand map[string]struct {
							PriceDimensions map[string]struct {
								PricePerUnit map[string]string `json:"pricePerUnit"`
							} `json:"priceDimensions"`
						} `json:"OnDemand"`
					} `json:"terms"`
					PublicationDate time.Time `json:"publicationDate"`
				}
				if err := json.Unmarshal([]byte(doc), &item); err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, tm := range item.Terms.OnDemand {
					for _, d := range tm.PriceDimensions {
						if d.PricePerUnit["USD"] == "" {
							t.Errorf("no USD price in %s", doc)
						}
						n++
					}
				}
				if n != 1 || !item.PublicationDate.Equal(fakepricing.PublicationDate) {
					t.Errorf("item %s", doc)
				}
			}
		})
	}

	t.Run("pages", func(t *testing.T) {
		p := pricing.NewGetProductsPaginator(c, &pricing.GetProductsInput{ServiceCode: aws.String("AmazonEC2"),
			MaxResults: aws.Int32(2), Filters: []types.Filter{term("regionCode", "us-east-1")}})
		items, pages := 0, 0
		for p.HasMorePages() {
			out, err := p.NextPage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			items, pages = items+len(out.PriceList), pages+1
		}
		if items != 5 || pages != 3 {
			t.Errorf("%d items in %d pages, want 5 in 3", items, pages)
		}
	})

	t.Run("denied", func(t *testing.T) {
		fake.Fail(1, 400, "AccessDeniedException", "not authorized to perform: pricing:GetProducts")
		_, err := c.GetProducts(ctx, &pricing.GetProductsInput{ServiceCode: aws.String("AmazonEC2")})
		var ade *types.AccessDeniedException
		if !errors.As(err, &ade) {
			t.Fatalf("err %v, want AccessDeniedException", err)
		}
	})
}
