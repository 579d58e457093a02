package fakebilling_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/googleapis/gax-go/v2/apierror"
	cloudbilling "google.golang.org/api/cloudbilling/v1"
	"google.golang.org/api/option"

	"github.com/fleetd/fleetd/providers/gcp/fakebilling"
)

// TestWireFormat: the raw answer has the real API's shape (units as a JSON
// string, nanos a number, nextPageToken while more pages follow), and the
// real client decodes it and follows the pages.
func TestWireFormat(t *testing.T) {
	fb := fakebilling.New(fakebilling.Options{MaxPageSize: 2})
	defer fb.Close()
	fb.AddSeries("A2 Instance", "Americas", []string{"us-central1"}, 0.031611, 0.004237, 0.0094833, 0.0012711)
	fb.AddGPU("Nvidia Tesla A100", "Americas", []string{"us-central1"}, 2.933908, 1.1736)

	resp, err := http.Get(fb.URL + "/v1/services/6F81-5844-456A/skus?pageSize=5000")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var raw struct {
		Skus []struct {
			Description string `json:"description"`
			PricingInfo []struct {
				PricingExpression struct {
					UsageUnit   string `json:"usageUnit"`
					TieredRates []struct {
						UnitPrice map[string]any `json:"unitPrice"`
					} `json:"tieredRates"`
				} `json:"pricingExpression"`
			} `json:"pricingInfo"`
		} `json:"skus"`
		NextPageToken string `json:"nextPageToken"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	if len(raw.Skus) != 2 || raw.NextPageToken == "" {
		t.Fatalf("first page: %d SKUs, token %q; want 2 and a token", len(raw.Skus), raw.NextPageToken)
	}
	up := raw.Skus[0].PricingInfo[0].PricingExpression.TieredRates[0].UnitPrice
	if _, ok := up["units"].(string); !ok || up["nanos"] != float64(31611000) || up["currencyCode"] != "USD" {
		t.Errorf("unitPrice %v: want units as a string, nanos 31611000, USD", up)
	}

	svc, err := cloudbilling.NewService(context.Background(), option.WithEndpoint(fb.URL+"/"), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	var descs []string
	err = svc.Services.Skus.List("services/"+fakebilling.ComputeEngine).Pages(context.Background(), func(r *cloudbilling.ListSkusResponse) error {
		for _, s := range r.Skus {
			descs = append(descs, s.Description)
			if p := s.PricingInfo[0].PricingExpression.TieredRates[0].UnitPrice; s.Description == "Nvidia Tesla A100 GPU running in Americas" && (p.Units != 2 || p.Nanos != 933908000) {
				t.Errorf("A100 price %+v, want 2 units 933908000 nanos", p)
			}
		}
		return nil
	})
	if err != nil || len(descs) != 6 || fb.Calls() != 4 {
		t.Errorf("client read %d SKUs in %d calls (%v), want 6 in 3 (+1 raw)", len(descs), fb.Calls(), err)
	}

	// Errors carry the ErrorInfo reason where the client finds it.
	fb.SetDisabled(true)
	_, err = svc.Services.Skus.List("services/" + fakebilling.ComputeEngine).Do()
	var ae *apierror.APIError
	if !errors.As(err, &ae) || ae.Reason() != "SERVICE_DISABLED" || ae.HTTPCode() != 403 {
		t.Errorf("disabled API: %v, want 403 SERVICE_DISABLED", err)
	}
}

// TestCredentials: with credentials configured, the fake answers a
// missing, wrong or right API key or bearer token as the real API does.
func TestCredentials(t *testing.T) {
	fb := fakebilling.New(fakebilling.Options{APIKey: "k", Token: "t"})
	defer fb.Close()
	cases := []struct {
		name, query, bearer string
		status              int
	}{
		{"none", "", "", 403},
		{"right key", "&key=k", "", 200},
		{"wrong key", "&key=x", "", 400},
		{"right token", "", "t", 200},
		{"wrong token", "", "x", 401},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest("GET", fb.URL+"/v1/services/6F81-5844-456A/skus?pageSize=1"+tc.query, nil)
		if tc.bearer != "" {
			req.Header.Set("Authorization", "Bearer "+tc.bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: HTTP %d, want %d", tc.name, resp.StatusCode, tc.status)
		}
	}
}
