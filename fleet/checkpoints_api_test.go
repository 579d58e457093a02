package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/fleetd/fleetd/fleet/agentapi"
	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/spec"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers/aws/motoserver"
	"github.com/fleetd/fleetd/providers/providertest"
)

// nodePost calls the node API as node and decodes a JSON answer into out.
func (td *testDaemon) nodePost(t *testing.T, fleet, node, op string, body, out any) int {
	t.Helper()
	b, _ := json.Marshal(body)
	code, rb, _ := td.call(t, "POST", "/v1/agent/"+fleet+"/"+node+"/"+op, "Bearer "+td.NodeToken(fleet, node), b)
	if out != nil && code == http.StatusOK {
		if err := json.Unmarshal(rb, out); err != nil {
			t.Fatalf("%s: %v: %s", op, err, rb)
		}
	}
	return code
}

// TestCheckpointNodeAPI drives the daemon's checkpoint calls as an agent
// would, against an S3 bucket on moto that only the daemon has keys for:
// URLs signed for layout keys only, listings, deletes limited to
// checkpoints beyond keep, and reports turned into status, alerts,
// events and metrics.
func TestCheckpointNodeAPI(t *testing.T) {
	srv := motoserver.StartT(t)
	c := s3.NewFromConfig(srv.Config("us-east-1"), func(o *s3.Options) { o.UsePathStyle = true })
	if _, err := c.CreateBucket(t.Context(), &s3.CreateBucketInput{Bucket: aws.String("ckpt")}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", motoserver.AccessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", motoserver.SecretAccessKey)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	store := fmt.Sprintf("s3://ckpt/runs/train?endpoint=%s&region=us-east-1&use_path_style=true", srv.URL())
	src := strings.Replace(memSpec, `command = ["python3", "train.py"]`, fmt.Sprintf(`command = ["python3", "train.py"]
    checkpoint {
      dir     = "ckpt"
      store   = %q
      keep    = 2
      size_gb = 50
    }`, store), 1)
	src += strings.Replace(strings.Replace(memSpec, `fleet "train"`, `fleet "local"`, 1), `command = ["python3", "train.py"]`, `command = ["python3", "train.py"]
    checkpoint { dir = "ckpt" }`, 1)

	mem := providertest.NewMemProvider()
	td := startTestDaemon(t, t.TempDir(), mem)
	ctx := context.Background()
	td.apply(ctx, t, "train.hcl", src)
	waitFor(t, "nodes", 10*time.Second, func() bool { return len(td.nodes(t, "train")) > 0 && len(td.nodes(t, "local")) > 0 })
	node := td.nodes(t, "train")[0].ID

	// Only layout keys are signed.
	for _, bad := range []string{"secrets.txt", "data/step-1/../../other/x", "manifests/step-1.json/../x"} {
		if code := td.nodePost(t, "train", node, "checkpoint/sign", api.CheckpointSignRequest{Method: "PUT", Keys: []string{bad}}, nil); code != http.StatusBadRequest {
			t.Errorf("signing %q: HTTP %d, want 400", bad, code)
		}
	}
	if code := td.nodePost(t, "train", node, "checkpoint/sign", api.CheckpointSignRequest{Method: "DELETE", Keys: []string{"manifests/step-1.json"}}, nil); code != http.StatusBadRequest {
		t.Errorf("signing DELETE: HTTP %d", code)
	}
	if code := td.nodePost(t, "local", td.nodes(t, "local")[0].ID, "checkpoint/sign", api.CheckpointSignRequest{Method: "GET", Keys: []string{"manifests/step-1.json"}}, nil); code != http.StatusConflict {
		t.Errorf("signing for a fleet without a store: HTTP %d, want 409", code)
	}
	// Three checkpoints through signed URLs, as an agent uploads them.
	for step := 1; step <= 3; step++ {
		keys := []string{fmt.Sprintf("data/step-%d/model.pt", step), fmt.Sprintf("manifests/step-%d.json", step)}
		var sr api.CheckpointSignResponse
		if code := td.nodePost(t, "train", node, "checkpoint/sign", api.CheckpointSignRequest{Method: "PUT", Keys: keys}, &sr); code != http.StatusOK {
			t.Fatalf("sign: HTTP %d", code)
		}
		if time.Until(sr.ExpiresAt) > agentapi.CheckpointURLExpiry || time.Until(sr.ExpiresAt) < agentapi.CheckpointURLExpiry-time.Minute {
			t.Errorf("expires at %s", sr.ExpiresAt)
		}
		for _, k := range keys {
			req, _ := http.NewRequest("PUT", sr.URLs[k], strings.NewReader("bytes of "+k))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("PUT %s: HTTP %d", k, resp.StatusCode)
			}
		}
	}
	var lr api.CheckpointListResponse
	if code := td.nodePost(t, "train", node, "checkpoint/list", api.CheckpointListRequest{Prefix: "manifests/"}, &lr); code != http.StatusOK || len(lr.Objects) != 3 {
		t.Fatalf("list: HTTP %d, %+v", code, lr)
	}
	if code := td.nodePost(t, "train", node, "checkpoint/list", api.CheckpointListRequest{Prefix: "../"}, nil); code != http.StatusBadRequest {
		t.Errorf("list ../: HTTP %d", code)
	}
	// keep = 2: step 1 may go, steps 2 and 3 not.
	for _, k := range []string{"manifests/step-3.json", "data/step-2/model.pt"} {
		if code := td.nodePost(t, "train", node, "checkpoint/delete", api.CheckpointDeleteRequest{Keys: []string{k}}, nil); code != http.StatusForbidden {
			t.Errorf("delete %s: HTTP %d, want 403", k, code)
		}
	}
	if code := td.nodePost(t, "train", node, "checkpoint/delete", api.CheckpointDeleteRequest{Keys: []string{"manifests/step-1.json", "data/step-1/model.pt"}}, nil); code != http.StatusOK {
		t.Fatalf("delete step 1: HTTP %d", code)
	}
	out, err := c.ListObjectsV2(t.Context(), &s3.ListObjectsV2Input{Bucket: aws.String("ckpt")})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, o := range out.Contents {
		left = append(left, *o.Key)
	}
	if len(left) != 4 || strings.Contains(strings.Join(left, " "), "step-1") {
		t.Fatalf("bucket holds %v", left)
	}

	// Reports: a failure is an alert and an event until an upload succeeds.
	now := time.Now().UTC()
	fail := api.CheckpointReport{Status: api.CheckpointNodeStatus{Dir: "/r/ckpt", LastStep: 2, LocalStep: 4, RestoredStep: -1, Error: "write …: access denied", ErrorKind: "denied", ErrorAt: now},
		Events: []api.CheckpointEvent{{Kind: "upload-failed", Step: 4, ErrorKind: "denied", Detail: "write s3://ckpt/runs/train data/step-4/model.pt: access denied: HTTP 403 AccessDenied", At: now}}}
	if code := td.nodePost(t, "train", node, "checkpoint/report", fail, nil); code != http.StatusOK {
		t.Fatalf("report: HTTP %d", code)
	}
	det, err := td.client.Fleet(ctx, "train")
	if err != nil {
		t.Fatal(err)
	}
	if det.Checkpoint == nil || det.Checkpoint.ErrorKind != "denied" || det.Checkpoint.ErrorNode != node || det.Checkpoint.LastStep != 2 {
		t.Fatalf("checkpoint status %+v", det.Checkpoint)
	}
	if len(det.Alerts) == 0 || det.Alerts[len(det.Alerts)-1].Kind != agentapi.AlertCheckpointStore || !strings.Contains(det.Alerts[len(det.Alerts)-1].Message, "nothing is deleted") {
		t.Fatalf("alerts %+v", det.Alerts)
	}
	checkLiveSchema(t, td) // with the failure in the checkpoint status
	ok := api.CheckpointReport{Status: api.CheckpointNodeStatus{Dir: "/r/ckpt", LastStep: 4, LastAt: now, LastBytes: 3 << 30, LocalStep: 4, RestoredStep: -1, UploadMiBps: 310},
		Events: []api.CheckpointEvent{{Kind: "uploaded", Step: 4, Bytes: 3 << 30, MiBps: 310, Seconds: 9.9, At: now.Add(time.Second)}}}
	if code := td.nodePost(t, "train", node, "checkpoint/report", ok, nil); code != http.StatusOK {
		t.Fatalf("report: HTTP %d", code)
	}
	det, _ = td.client.Fleet(ctx, "train")
	if c := det.Checkpoint; c.Error != "" || c.LastStep != 4 || c.Bytes != 3<<30 || c.UploadMiBps != 310 {
		t.Fatalf("after the upload: %+v", c)
	}
	for _, a := range det.Alerts {
		if a.Kind == agentapi.AlertCheckpointStore {
			t.Fatalf("alert outlived the successful upload: %+v", a)
		}
	}
	checkLiveSchema(t, td)
	var types []string
	evs, err := td.client.Events(ctx, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Events {
		if strings.HasPrefix(e.Type, "checkpoint.") {
			types = append(types, e.Type+": "+e.Message)
		}
	}
	joined := strings.Join(types, "\n")
	if !strings.Contains(joined, "checkpoint.upload_failed: checkpoint upload failed on "+node) || !strings.Contains(joined, "checkpoint.uploaded: checkpoint step 4 uploaded by "+node+": 3.00 GiB") {
		t.Fatalf("events:\n%s", joined)
	}
	// The measured size prices a move now (size_gb was 50).
	fl, err := td.fleetSpecByName(ctx, "train")
	if err != nil {
		t.Fatal(err)
	}
	if m := td.moveCost(fl); m == nil || m.Bytes != 3<<30 || m.Source.Cloud != "aws" || m.Source.Region != "us-east-1" {
		t.Fatalf("move cost %+v", m)
	}
	_, mb, _ := td.call(t, "GET", "/metrics", "Bearer "+td.Token(), nil)
	for _, want := range []string{`fleetd_checkpoint_last_step{fleet="train"} 4`, `fleetd_checkpoint_bytes{fleet="train"} 3.221225472e+09`,
		`fleetd_checkpoint_upload_mib_per_second{fleet="train"} 310`, `fleetd_checkpoint_store_failing{fleet="train"} 0`, `fleetd_checkpoint_last_step{fleet="local"} -1`} {
		if !strings.Contains(string(mb), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// fleetSpecByName is the stored spec of a fleet.
func (td *testDaemon) fleetSpecByName(ctx context.Context, name string) (*spec.Fleet, error) {
	var f state.Fleet
	if err := td.Store().View(ctx, func(tx state.Tx) error {
		var err error
		f, err = tx.Fleet(name)
		return err
	}); err != nil {
		return nil, err
	}
	return td.fleetSpec(f)
}

// TestPlanShowsMoveCost: `fleetd plan` of a fleet with a checkpoint size
// says what restoring it where the nodes would go costs.
func TestPlanShowsMoveCost(t *testing.T) {
	mem := providertest.NewMemProvider()
	td := startTestDaemon(t, t.TempDir(), mem)
	src := strings.Replace(memSpec, `command = ["python3", "train.py"]`, `command = ["python3", "train.py"]
    checkpoint {
      dir     = "ckpt"
      store   = "s3://ckpt/runs/train?region=us-east-1"
      size_gb = 200
    }`, 1)
	src = strings.Replace(src, `colocate = "region"`, `colocate = "region"
    egress_per_gb = { "aws->mem" = 0.05 }`, 1)
	p, err := td.client.Plan(context.Background(), api.ApplyRequest{Filename: "train.hcl", Source: src})
	if err != nil {
		t.Fatal(err)
	}
	notes := strings.Join(p.Fleets[0].Notes, "\n")
	t.Logf("plan notes:\n%s", notes)
	// 3 nodes restore 200 GB from aws:us-east-1 at the overridden $0.05/GB.
	if !strings.Contains(notes, "moving the job here: checkpoint aws:us-east-1→mem:") || !strings.Contains(notes, "for 3 node(s): egress $30.00 ($0.050/GB)") ||
		!strings.Contains(notes, "spec placement.egress_per_gb") {
		t.Fatalf("plan notes:\n%s", notes)
	}
}
