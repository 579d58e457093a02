echo "setting up"
pip install -r requirements.txt
